"""The watchdog and the self-tuning bound in real (tiny) runs: the in-process loop and pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.tiny import write_assets

from slipstream.config import Config, load_config
from slipstream.files import read_jsonl
from slipstream.run.sync import train_sync

REWARD = "def odd(prompt, completion):\n    return float(len(completion) % 2)\n"


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    return write_assets(tmp_path_factory.mktemp("assets"), REWARD)


def small_cfg(tmp_path: Path, assets: Path, name: str, *extra: str, steps: int) -> Config:
    """A random model of the built-in shape with wide weights and a reward it earns about half
    the time (odd-length completions): rewards vary from the first step, with no warm start,
    so nothing depends on what the warm-start cache holds (an empty one on a fresh machine)."""
    return load_config(None, [
        f'run.dir="{tmp_path / name}"', f"run.steps={steps}", "run.quiet=true", "run.threads=1",
        f'model.path="{assets / "model"}"', 'task.kind="jsonl"',
        f'task.path="{assets / "rows.jsonl"}"', f'task.reward="{assets / "reward.py"}:odd"',
        "sampling.max_new_tokens=16", "trainer.batch_prompts=8", "sampling.group_size=4",
        "trainer.lr=6e-4",  # the built-in model's (a model.path run defaults to TRL's 1e-6)
        "eval.every=3", "eval.num_prompts=16", "filters.zero_variance=false", *extra,
    ])  # fmt: skip


SPIKE = [
    "watchdog.enabled=true",
    "watchdog.inject_lr_spike_at=4",
    "watchdog.inject_lr_spike_factor=1000.0",
    "watchdog.inject_lr_spike_steps=1",
    "watchdog.step_kl_limit=0.5",
    'watchdog.actions={step_kl="rollback", grad_spike="rollback", nonfinite="rollback"}',
    "checkpoint.every=1",
    "checkpoint.keep=1",
    # no entropy or constant-reward alarm: in a pipeline run they read whichever groups came
    # first (timing), and a warn before the spike moves the rollback's target checkpoint
    "watchdog.entropy_drop_rate=0",
    "watchdog.reward_constant_steps=0",
]


@pytest.mark.slow
def test_sync_loop_rolls_back_an_lr_spike(tmp_path, assets):
    cfg = small_cfg(tmp_path, assets, "wd", *SPIKE, steps=6)
    summary = train_sync(cfg)
    wd = summary["watchdog"]
    assert wd["rollbacks"] >= 1, wd
    first = next(e for e in wd["events"] if e["action"] == "rollback")
    assert first["step"] == 4 and first["alarm"] == "step_kl"
    recs = read_jsonl(tmp_path / "wd" / "metrics.jsonl")
    steps = [r["step"] for r in recs if "train/loss" in r]
    assert steps == sorted(steps) and steps[-1] == 6  # the version count goes on
    # halved by the rollback at step 4, then one healthy step (5) of the default 10-step
    # climb back (rollback_lr_recover_steps) before step 6
    assert recs[-1]["watchdog/lr_scale"] == pytest.approx(0.5 * 2 ** (1 / 10))
    assert json.loads((tmp_path / "wd" / "summary.json").read_text())["watchdog"]["rollbacks"] >= 1


@pytest.mark.slow
def test_pipeline_auto_lag_and_rollback(tmp_path, assets):
    from slipstream.run.launch import train_async

    cfg = small_cfg(
        tmp_path, assets, "auto", 'schedule.name="pipeline"', 'schedule.max_lag="auto"',
        'runtime.kind="local"', "schedule.max_lag_max=3", "schedule.auto_patience=1",
        "schedule.auto_min_gain=0", *SPIKE, steps=8,
    )  # fmt: skip
    summary = train_async(cfg)
    recs = [r for r in read_jsonl(tmp_path / "auto" / "metrics.jsonl") if "train/loss" in r]
    assert all(0 <= r["schedule/max_lag"] <= 3 for r in recs)
    assert all(r["staleness/lag_max"] <= 3 for r in recs)
    assert summary["ledger"]["balanced"]
    assert summary["watchdog"]["rollbacks"] >= 1


@pytest.mark.slow
def test_a_run_resumed_after_a_rollback_goes_on_with_the_watchdogs_state(tmp_path, assets):
    """The rollback at step 4 halves the learning rate, which then climbs back; a run stopped
    at step 5 and resumed for step 6 must train step 6 as the unbroken run does (same
    multiplier, same rollback count, same loss), not with a fresh watchdog."""
    whole = train_sync(small_cfg(tmp_path, assets, "whole", *SPIKE, steps=6))
    train_sync(small_cfg(tmp_path, assets, "cut", *SPIKE, steps=5))
    resumed = train_sync(small_cfg(tmp_path, assets, "cut", *SPIKE, steps=6), resume=True)
    assert whole["watchdog"]["rollbacks"] == resumed["watchdog"]["rollbacks"] == 1

    def last(name: str) -> dict:
        return [r for r in read_jsonl(tmp_path / name / "metrics.jsonl") if "train/loss" in r][-1]

    a, b = last("whole"), last("cut")
    assert a["step"] == b["step"] == 6
    assert b["watchdog/lr_scale"] == a["watchdog/lr_scale"] < 1.0
    assert b["train/loss"] == a["train/loss"]


ORCHESTRATED = {
    "inprocess": [],
    "pipeline": ['schedule.name="pipeline"', 'runtime.kind="local"'],
    "deferred": ['schedule.name="pipeline"', 'runtime.kind="local"', "runtime.defer_eval=true"],
}


@pytest.mark.slow
@pytest.mark.parametrize("loop", list(ORCHESTRATED))
def test_a_run_that_rolls_back_at_its_last_step_reports_the_restored_weights(
    tmp_path, assets, loop
):
    """The spike at step 4 of 4 is rolled back to step 3's checkpoint and the run ends there
    (the version count reached `run.steps`): its final held-out accuracy is measured on those
    restored weights, so it equals step 3's evaluation, not the collapsed step 4's (which was
    evaluated before the rollback). The restored weights keep version 4: an orchestrated run
    published them as version 5, one past `run.steps` (summary `steps` 5, a checkpoint
    step_000005, a held-out curve point at step 5)."""
    from slipstream.run.launch import train_async
    from slipstream.train.checkpoint import list_checkpoints

    extra = ORCHESTRATED[loop]
    cfg = small_cfg(tmp_path, assets, loop, *extra, *SPIKE, steps=4)
    summary = (train_async if extra else train_sync)(cfg)
    assert summary["watchdog"]["rollbacks"] == 1
    recs = {r["step"]: r for r in read_jsonl(tmp_path / loop / "metrics.jsonl")}
    assert recs[4]["watchdog/action"] == "rollback"
    if loop != "deferred":  # (deferred: the records hold no accuracy, nor the curve step 4's)
        assert summary["heldout_acc_end"] == recs[3]["heldout_acc"] != recs[4]["heldout_acc"]
    assert summary["steps"] == 4 and list_checkpoints(tmp_path / loop)[-1].name == "step_000004"
    if extra:  # the curve's point at step 4 is the restored weights' (one point a step)
        curve = {c["step"]: c["heldout_acc"] for c in summary["heldout_curve"]}
        assert list(curve) == [0, 3, 4] and curve[4] == curve[3] == summary["heldout_acc_end"]
