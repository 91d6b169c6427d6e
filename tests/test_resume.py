"""Never lose work: a run killed after a checkpoint and resumed follows the unbroken trajectory."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from slipstream.cli import main
from slipstream.files import read_jsonl
from slipstream.observe.rollouts import RolloutWriter
from slipstream.run.sync import train_sync
from slipstream.train.checkpoint import load_trainer_state
from tiny import steady, tiny_cfg


class Killed(Exception):
    pass


def _weights(run_dir, step):
    return load_file(
        str(run_dir / "checkpoints" / f"step_{step:06d}" / "model" / "model.safetensors")
    )


# replay: its buffer and rng must be restored too. The soft pass-rate band over a pool of 2
# prompts the 30-step warm start never solves: skips from step 2 on, and each decision hashes
# the prompt's skips since its last group.
SETTINGS = {
    "replay": ("replay.enabled=true",),
    "soft_band": (
        "filters.pass_rate_band=true", "filters.pass_rate_skip_prob=0.5",
        "filters.pass_rate_min_attempts=4", "task.max_train_prompts=2",
    ),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SETTINGS))
def test_killed_and_resumed_run_is_bit_identical(tmp_path, monkeypatch, case):
    steps = SETTINGS[case]
    whole = train_sync(tiny_cfg(tmp_path, "whole", *steps, steps=4))

    write = RolloutWriter.write

    def die_after_step_3(self, step, groups):  # the step-3 record is written, its checkpoint is not
        write(self, step, groups)
        if step == 3:
            raise Killed

    monkeypatch.setattr(RolloutWriter, "write", die_after_step_3)
    with pytest.raises(Killed):
        train_sync(tiny_cfg(tmp_path, "broken", *steps, steps=4))
    monkeypatch.undo()
    broken = tmp_path / "broken"
    assert [r["step"] for r in read_jsonl(broken / "metrics.jsonl")] == [1, 2, 3]

    assert main(["train", "--resume", str(broken)]) == 0
    # the killed run's step-3 rollouts were dropped with its record: each step shows once
    marks = [
        line
        for line in (broken / "rollouts.txt").read_text().splitlines()
        if line.startswith("#####")
    ]
    assert marks == [f"##### step {i} #####" for i in (1, 2, 3, 4)]
    a, b = read_jsonl(tmp_path / "whole" / "metrics.jsonl"), read_jsonl(broken / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert steady(a) == steady(b)
    wa, wb = _weights(tmp_path / "whole", 4), _weights(broken, 4)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    summary = json.loads((broken / "summary.json").read_text())
    assert summary["heldout_acc_start"] == whole["heldout_acc_start"]
    assert summary["heldout_acc_end"] == whole["heldout_acc_end"]
    assert summary["ledger"] == whole["ledger"]
    trainer_state = load_trainer_state(broken / "checkpoints" / "step_000004")  # weights_only=True
    assert trainer_state["version"] == 4 and isinstance(trainer_state["rng_torch"], torch.Tensor)


@pytest.mark.parametrize("make", ["nothing", "config_only"])
def test_resume_without_checkpoint_or_config_exits_2(tmp_path, capsys, make):
    run = tmp_path / "run"
    run.mkdir()
    if make == "config_only":
        (run / "config.toml").write_text("[run]\nquiet = true\n")
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert ("no config.toml" if make == "nothing" else "no checkpoint") in err


@pytest.mark.slow
def test_resumed_run_forecasts_its_first_step_from_the_steps_before(tmp_path, monkeypatch):
    """Killed after step 4 (checkpoint at 3) of 5 and resumed: step 4's record, the first
    after the resume, carries the forecast of a run that observed steps 1-4, calibrated on
    the 3 steps before the resume (the forecast needs 4; a resumed run's used to start empty)."""
    from slipstream.sim.forecast import OnlineForecast

    write = RolloutWriter.write

    def die_after_step_4(self, step, groups):
        write(self, step, groups)
        if step == 4:
            raise Killed

    monkeypatch.setattr(RolloutWriter, "write", die_after_step_4)
    with pytest.raises(Killed):
        train_sync(tiny_cfg(tmp_path, "f", "checkpoint.every=3", steps=5))
    monkeypatch.undo()
    run = tmp_path / "f"
    assert main(["train", "--resume", str(run)]) == 0
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    offline = OnlineForecast(run, total_steps=5, eval_every=2, every=5, ckpt_every=3)
    expected = [offline.observe(r, eval_in_wall=True) for r in records[:4]][-1]
    assert expected and {k: records[3][k] for k in expected} == expected


def test_a_run_of_relative_paths_resumes_from_another_folder(tmp_path, monkeypatch, capsys):
    """config.toml keeps paths as typed (`model.path="model"`): `--resume` from any other
    folder than the one the run started in failed with 'model.path: model does not exist'.
    The run folder records where it started (launch.json), and the resume works there."""
    from tiny import write_assets

    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    write_assets(start, "def odd(prompt, completion):\n    return float(len(completion) % 2)\n")
    elsewhere.mkdir()
    monkeypatch.chdir(start)
    args = [
        "model.path=model", "task.path=rows.jsonl", 'task.reward="reward.py:odd"',
        "run.dir=r", "run.steps=2", "run.quiet=true", "checkpoint.every=1", "eval.every=2",
        "trainer.lr=6e-4", "sampling.max_new_tokens=16", "trainer.batch_prompts=4",
        "sampling.group_size=4", "eval.num_prompts=4", "filters.zero_variance=false",
    ]  # fmt: skip
    assert main(["train", *args]) == 0
    monkeypatch.chdir(elsewhere)
    assert main(["train", "--resume", str(start / "r"), "run.steps=3"]) == 0
    assert f"resuming in {start}" in capsys.readouterr().err
    assert json.loads((start / "r" / "summary.json").read_text())["steps"] == 3


@pytest.mark.slow
def test_tensorboard_of_a_resumed_run_shows_each_step_once(tmp_path):
    """Killed after step 3's record and before its checkpoint, resumed from step 2: the
    resumed run writes step 3 again, and TensorBoard shows it once (`purge_step`), as
    metrics.jsonl does (`rewind`); TensorBoard used to show steps 1, 2, 3, 3."""
    pytest.importorskip("tensorboard", reason="tensorboard not installed: pip install tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tiny import write_assets

    write_assets(tmp_path, "def odd(prompt, completion):\n    return float(len(completion) % 2)\n")
    run = tmp_path / "r"
    args = [
        f'model.path="{tmp_path / "model"}"', f'task.path="{tmp_path / "rows.jsonl"}"',
        f'task.reward="{tmp_path / "reward.py"}:odd"', f'run.dir="{run}"', "run.steps=3",
        "run.quiet=true", 'run.sinks=["jsonl", "tensorboard"]', "checkpoint.every=2",
        "eval.every=2", "sampling.max_new_tokens=16", "trainer.batch_prompts=4",
        "sampling.group_size=4", "eval.num_prompts=4", "filters.zero_variance=false",
    ]  # fmt: skip
    assert main(["train", *args]) == 0
    shutil.rmtree(run / "checkpoints" / "step_000003", ignore_errors=True)
    assert main(["train", "--resume", str(run)]) == 0
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward_mean")] == [1, 2, 3]
