"""A sync run that raises mid-way, through `slipstream train`: exit 1 with the traceback and
one line saying what failed; the live view stopped, metrics and timeline closed with every
step written so far, and a `ledger.json` that adds up (what `train_async` leaves)."""

from __future__ import annotations

import json

import slipstream.run.sync as sync
from slipstream.cli import main
from slipstream.files import read_jsonl
from slipstream.observe.timeline import read_timeline
from slipstream.run.setup import Run
from slipstream.train.trainer import Trainer
from tiny import write_assets

# 2 prompts x 2 samples of at most 8 tokens a step, every group kept: ~0.6 s here (the first
# model a process loads costs ~4 s more, once: torch imports its compiler)
OVERRIDES = [
    "run.steps=3", "run.threads=1", "trainer.batch_prompts=2", "sampling.group_size=2",
    "sampling.max_new_tokens=8", "filters.zero_variance=false", "task.kind=jsonl",
    "task.reward=exact", "eval.num_prompts=2", "eval.every=2", "checkpoint.every=2",
]  # fmt: skip


def test_a_sync_run_that_raises_closes_its_view_sinks_and_timeline(
    tmp_path, capsys, monkeypatch
) -> None:
    """Before, `train_sync` closed these only on a clean finish: a failed run left the live
    view drawing (a notebook's next run, or the terminal, got its frames and a hidden cursor),
    the metrics and timeline files open, and no ledger.json."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # stderr counts as a terminal: a live view
    runs: list[Run] = []
    real_setup, real_step = sync.setup, Trainer.step

    def recording(cfg, *args):  # setup(cfg, resume_step)
        runs.append(real_setup(cfg, *args))
        return runs[-1]

    def step(self, groups):
        if self.version == 1:  # the second optimizer step
            raise RuntimeError("boom at step 2")
        return real_step(self, groups)

    monkeypatch.setattr(sync, "setup", recording)
    monkeypatch.setattr(Trainer, "step", step)
    assets = write_assets(tmp_path, "")  # a user model (no warm start) and running-sums rows
    rc = main(
        [
            "train",
            *OVERRIDES,
            f'run.dir="{tmp_path / "f"}"',
            f'model.path="{assets / "model"}"',
            f'task.path="{assets / "rows.jsonl"}"',
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1
    (run,) = runs
    assert not run.view.quiet and run.view._live is None  # it was live, and was stopped
    assert all(s.inner._f.closed for s in run.sink.sinks if hasattr(s.inner, "_f"))
    assert run.timeline._sink.inner._f.closed
    # the traceback, then one line of what failed and one of where to go on from
    tail = err.rstrip("\n").splitlines()[-3:]
    assert tail[0] == "RuntimeError: boom at step 2", err
    assert tail[1] == "slipstream: training failed: RuntimeError: boom at step 2", err
    assert tail[2].startswith("slipstream: no checkpoint was written yet"), err
    assert "Traceback (most recent call last)" in err
    d = run.dir
    assert [r["step"] for r in read_jsonl(d / "metrics.jsonl")] == [1]
    kinds = [(iv.actor, iv.kind) for iv in read_timeline(d / "timeline.jsonl")]
    assert kinds.count(("sampler0", "generate")) == 2  # step 2's generation is in it
    assert kinds.count(("trainer", "train")) == 1
    ledger = json.loads((d / "ledger.json").read_text())
    # 2 prompts a step, every group kept (filters.zero_variance=false): step 2's are in flight
    assert ledger["generated"] == 4 and ledger["trained"] == 2 and ledger["in_flight"] == 2
    assert ledger["balanced"], ledger
    assert not (d / "summary.json").exists()  # as train_async: a summary is of a whole run


FAILS_AFTER_STEP_2 = """
from pathlib import Path

def reward(prompt, completion):
    if Path(__file__).parent.joinpath("f", "checkpoints", "step_000002").exists():
        raise ValueError("injected reward failure")
    return float(len(completion) % 2)
"""


def test_a_reward_that_fails_the_run_after_a_checkpoint_says_where_to_resume(tmp_path, capsys):
    """`task.reward_errors = 'fail'`: one line and exit 2, as before, then where to go on from
    (the line every other failure ends with); before, a checkpoint was there but not said."""
    assets = write_assets(tmp_path, FAILS_AFTER_STEP_2)
    run = tmp_path / "f"
    rc = main([
        "train", *OVERRIDES, f'run.dir="{run}"', f'model.path="{assets / "model"}"',
        f'task.path="{assets / "rows.jsonl"}"', f'task.reward="{assets / "reward.py"}:reward"',
        'task.reward_errors="fail"', 'task.reward_isolation="inline"',
    ])  # fmt: skip
    err = capsys.readouterr().err.rstrip("\n").splitlines()
    assert rc == 2 and "Traceback (most recent call last):" not in err, err
    assert err[-2].startswith("slipstream train: error: reward ") and " on prompt " in err[-2], err
    assert err[-2].endswith("injected reward failure (task.reward_errors = 'fail')"), err
    assert err[-1] == (
        f"slipstream: newest checkpoint {run / 'checkpoints' / 'step_000002'}; "
        f"continue with: slipstream train --resume {run}"
    )
