"""Resuming an orchestrated run with the command its failure printed (`slipstream train
--resume RUN_DIR`): a recorded run goes on unrecorded, and a resume that fails leaves the
run's config.toml as it was, so the same command can be given again.

One `pipeline` run on the local runtime (1 sampler, recorded, a checkpoint at step 2) is killed
after step 3; each test resumes a copy of its folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slipstream.cli import main
from slipstream.config import load_config
from slipstream.files import read_jsonl
from tiny import write_assets

pytestmark = pytest.mark.slow

REWARD = "def odd(prompt, completion):\n    return float(len(completion) % 2)\n"


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    """The run folder of a recorded 4-step pipeline run killed after step 3."""
    from slipstream.observe.rollouts import RolloutWriter
    from slipstream.run.launch import train_async

    assets = write_assets(tmp_path_factory.mktemp("assets"), REWARD)
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    cfg = load_config(None, [
        f'run.dir="{run_dir}"', "run.steps=4", "run.quiet=true", "run.threads=1",
        "run.record_schedule=true", f'model.path="{assets / "model"}"', 'task.kind="jsonl"',
        f'task.path="{assets / "rows.jsonl"}"', f'task.reward="{assets / "reward.py"}:odd"',
        "sampling.max_new_tokens=16", "trainer.batch_prompts=4", "sampling.group_size=4",
        "trainer.lr=6e-4", "eval.every=2", "eval.num_prompts=8", "checkpoint.every=2",
        'runtime.kind="local"', "runtime.trainer_threads=1", "runtime.threads_per_sampler=1",
        'schedule.name="pipeline"', "schedule.max_lag=1",
    ])  # fmt: skip
    write = RolloutWriter.write

    def die_after_step_3(self, step, groups):
        write(self, step, groups)
        if step == 3:
            raise Killed

    with pytest.MonkeyPatch.context() as mp, pytest.raises(Killed):
        mp.setattr(RolloutWriter, "write", die_after_step_3)
        train_async(cfg)
    return run_dir


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    """The killed run's folder, copied (`--resume` names the folder; config.toml's run.dir
    is the original's, which the resume replaces)."""
    return Path(shutil.copytree(run_dir, tmp_path / "run"))


def test_a_recorded_run_resumes_unrecorded_with_one_warning(killed, tmp_path, capsys):
    """`run.record_schedule = true` in the run's config.toml made `--resume` (the command
    printed on failure) a config error (exit 2); now recording is off for the resumed run,
    with one warning line, and the record stays marked incomplete (resumed from step 2)."""
    run = _copy(killed, tmp_path)
    assert main(["train", "--resume", str(run)]) == 0
    warnings = [x for x in capsys.readouterr().err.splitlines() if "warning" in x]
    assert len(warnings) == 1 and "run.record_schedule off" in warnings[0], warnings
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4]
    meta = json.loads((run / "schedule" / "meta.json").read_text())
    assert meta["complete"] is False and meta["resumed_from"] == 2
    assert load_config(run / "config.toml").run.record_schedule is False


def test_a_resume_that_fails_to_restore_leaves_config_toml_as_it_was(killed, tmp_path, capsys):
    """config.toml was rewritten with the resume's settings when the run was set up, before
    its checkpoint was restored: a resume that failed there left the run described by settings
    it never ran with. It is written once the checkpoint is restored."""
    run = _copy(killed, tmp_path)
    (run / "checkpoints" / "step_000002" / "trainer.pt").write_bytes(b"not a checkpoint")
    before = (run / "config.toml").read_bytes()
    assert main(["train", "--resume", str(run), "trainer.lr=1e-3"]) == 1
    assert "continue with: slipstream train --resume" in capsys.readouterr().err
    assert (run / "config.toml").read_bytes() == before


def test_a_deferred_run_killed_after_its_last_checkpoint_resumes_with_its_whole_curve(
    tmp_path,
):
    """`runtime.defer_eval`: killed while scoring its snapshots (after the checkpoint of its
    last step), the run resumed trains nothing and scores them: its summary's curve and start
    accuracy are the unbroken run's. Before, the checkpoint held no curve and no snapshots,
    and the resume raised IndexError (an empty curve), again at every retry."""
    from slipstream.run.launch import train_async
    from slipstream.run.learner import RunLearner

    assets = write_assets(tmp_path / "assets", REWARD)

    def cfg(run_dir: Path):
        return load_config(None, [
            f'run.dir="{run_dir}"', "run.steps=4", "run.quiet=true", "run.threads=1",
            f'model.path="{assets / "model"}"', 'task.kind="jsonl"',
            f'task.path="{assets / "rows.jsonl"}"', f'task.reward="{assets / "reward.py"}:odd"',
            "sampling.max_new_tokens=16", "trainer.batch_prompts=4", "sampling.group_size=4",
            "trainer.lr=6e-4", "eval.every=2", "eval.num_prompts=8", "checkpoint.every=2",
            'runtime.kind="local"', "runtime.trainer_threads=1", "runtime.threads_per_sampler=1",
            'schedule.name="sync"', "runtime.defer_eval=true",
        ])  # fmt: skip

    whole = train_async(cfg(tmp_path / "whole"))
    with pytest.MonkeyPatch.context() as mp, pytest.raises(Killed):
        mp.setattr(RunLearner, "evaluate_deferred", lambda self: (_ for _ in ()).throw(Killed()))
        train_async(cfg(tmp_path / "run"))
    resumed = train_async(cfg(tmp_path / "run"), resume=True)

    def curve(s: dict) -> list[tuple[int, float]]:
        return [(c["step"], c["heldout_acc"]) for c in s["heldout_curve"]]

    assert curve(resumed) == curve(whole) and [s for s, _ in curve(whole)] == [0, 2, 4]
    assert resumed["heldout_acc_start"] == whole["heldout_acc_start"]
    assert resumed["heldout_acc_end"] == whole["heldout_acc_end"]
    assert not (tmp_path / "run" / "eval_snapshots").exists()
