"""The collapse watchdog: the alarms' math, the actions, the protected rollback checkpoint."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from slipstream.algo import alarms
from slipstream.config import ConfigError, WatchdogConfig, load_config
from slipstream.model.builtin import init_builtin
from slipstream.schedule.watchdog import Watchdog, undone
from slipstream.train.checkpoint import list_checkpoints, save_checkpoint
from slipstream.types import FinishReason, Group, Prompt, Sample


def test_entropy_drop():
    # 1.0 -> 0.6 over 4 steps: (1.0 - 0.6) / (1.0 * 4) = 10% a step
    assert alarms.entropy_drop([1.0, 0.9, 0.8, 0.7, 0.6], 0.09) is not None
    assert alarms.entropy_drop([1.0, 0.9, 0.8, 0.7, 0.6], 0.11) is None
    assert alarms.entropy_drop([1.0, 0.6], 0.0) is None  # off


def test_step_kl_ess_nonfinite():
    assert alarms.step_kl(0.2, 0.1) is not None and alarms.step_kl(0.05, 0.1) is None
    assert alarms.step_kl(math.nan, 0.1) is not None
    assert alarms.step_kl(5.0, 0.0) is None  # off
    assert alarms.ess_low(0.5, 0.6) is not None and alarms.ess_low(0.7, 0.6) is None
    assert alarms.nonfinite(math.inf, 1.0) is not None and alarms.nonfinite(1.0, 1.0) is None


def test_reward_constant_and_grad_spike():
    assert alarms.reward_constant([0.5, 0.0, 0.0], 2) is not None
    assert alarms.reward_constant([0.0, 0.5, 0.0], 2) is None
    assert alarms.reward_constant([0.0], 2) is None  # not enough steps yet
    # median of [1, 2, 1.5] is 1.5; 16 > 10 x 1.5
    assert alarms.grad_spike([1.0, 2.0, 1.5, 16.0], 10.0) is not None
    assert alarms.grad_spike([1.0, 2.0, 1.5, 14.0], 10.0) is None
    assert alarms.grad_spike([1.0, 2.0, math.inf], 10.0) is not None


class FakeTrainer:
    def __init__(self) -> None:
        self.version = 0
        self.lr_scale = 1.0
        self.measure_step_kl = False


def ckpt(root: Path, step: int) -> None:
    d = root / "checkpoints" / f"step_{step:06d}"
    d.mkdir(parents=True)
    (d / "state.json").write_text("{}")


def record(step: int, **kw: float) -> dict:
    return {"step": step, "train/entropy": 1.0, "train/loss": 0.1, "train/grad_norm": 1.0, **kw}


def watchdog(tmp_path: Path, **cfg) -> tuple[Watchdog, FakeTrainer, list]:
    t = FakeTrainer()
    logs: list[str] = []
    wd = Watchdog(WatchdogConfig(enabled=True, **cfg), t, tmp_path, logs.append)  # type: ignore[arg-type]
    return wd, t, logs


def test_rollback_restores_the_newest_checkpoint_before_the_first_alarm(tmp_path):
    wd, t, logs = watchdog(
        tmp_path, actions={"step_kl": "rollback", "grad_spike": "rollback"}, rollback_margin=1,
        rollback_lr_scale=0.5, max_rollbacks=1,
    )  # fmt: skip
    assert t.measure_step_kl
    done = []
    wd.rollback = lambda path, last: done.append((path.name, last))
    for s in (2, 4, 6):
        ckpt(tmp_path, s)
    t.version = 5
    rec = record(5, **{"train/step_kl": 0.01})
    assert wd.observe(rec, []) == "" and rec["watchdog/alarms"] == 0
    t.version = 6  # a warned alarm at 6 opens the episode; checkpoint 6 is after it
    rec = record(6, **{"train/step_kl": 1.0})
    assert wd.observe(rec, []) == "rollback"
    assert done == [("step_000004", 6)]  # newest at most 6 - 1 = 5
    assert rec["watchdog/action"] == "rollback" and rec["watchdog/rollbacks"] == 1
    assert wd.rollback_scale == 0.5
    wd.before_step()
    assert t.lr_scale == 0.5
    t.version = 7  # past max_rollbacks: warn only
    rec = record(7, **{"train/step_kl": 1.0})
    assert wd.observe(rec, []) == "warn"
    s = wd.summary()
    assert s["rollbacks"] == 1 and [e["action"] for e in s["events"]] == ["rollback", "warn"]
    assert any("refused" in line for line in logs)


def test_protected_is_the_rollback_target_and_keep_spares_it(tmp_path):
    wd, t, _ = watchdog(tmp_path, actions={"step_kl": "rollback"}, rollback_margin=2)
    ckpt(tmp_path, 1)
    ckpt(tmp_path, 2)
    t.version = 3
    wd.observe(record(3, **{"train/step_kl": 1.0}), [])  # no rollback fn: refused, warn
    assert wd.first_alarm == 3 and wd.protected() == {1}  # newest at most 3 - 2
    assert wd.hold_checkpoint()
    # save_checkpoint's pruning, keep=1: step 1 survives the saves of steps 4 and 6
    model, tok = init_builtin(seed=1)
    for s in (4, 6):
        save_checkpoint(tmp_path, s, model, tok, {}, {}, keep=1, protect=wd.protected())
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000001", "step_000006"]


def test_tighten_scales_lr_for_n_steps_and_asks_for_k0(tmp_path):
    asked = []
    t = FakeTrainer()
    cfg = WatchdogConfig(
        enabled=True, actions={"grad_spike": "tighten"}, tighten_steps=2, tighten_lr_scale=0.25
    )

    def tighten(n: int, rec: dict) -> None:
        asked.append((n, rec["step"]))

    wd = Watchdog(cfg, t, tmp_path, lambda m: None, tighten)  # type: ignore[arg-type]
    for s, g in enumerate([1.0, 1.0, 1.0, 50.0], start=1):
        wd.observe(record(s, **{"train/grad_norm": g}), [])
    assert asked == [(2, 4)]  # with the step's record, still open
    scales = []
    for _ in range(3):
        wd.before_step()
        scales.append(t.lr_scale)
    assert scales == [0.25, 0.25, 1.0]


def test_injected_spike_fires_once(tmp_path):
    wd, t, _ = watchdog(tmp_path, inject_lr_spike_at=3, inject_lr_spike_factor=10.0,
                        inject_lr_spike_steps=2)  # fmt: skip
    scales = []
    for v in range(6):
        t.version = v
        wd.before_step()
        scales.append(t.lr_scale)
    assert scales == [1.0, 1.0, 10.0, 10.0, 1.0, 1.0]
    t.version = 1  # a rollback rewinds nothing of the injection
    wd.before_step()
    assert t.lr_scale == 1.0


def group(versions: list[int], reward: float = 0.0) -> Group:
    n = len(versions)
    s = Sample("p", [1], [2] * n, [0.0] * n, versions, FinishReason.STOP, reward=reward)
    return Group(Prompt("p", "x", "y"), [s])


def test_undone_and_empty_batch(tmp_path):
    assert undone(group([3, 4]), 4, 6) and not undone(group([1, 2, 7]), 3, 6)
    wd, _, _ = watchdog(tmp_path, reward_constant_steps=1)
    assert wd.observe_empty([group([1]), group([1])], 4) == "warn"


def test_config_errors():
    with pytest.raises(ConfigError, match=r"watchdog\.actions\.bogus"):
        load_config(None, ['watchdog.actions={bogus="warn"}'])
    with pytest.raises(ConfigError, match=r"watchdog\.actions"):
        load_config(None, ['watchdog.actions={step_kl="explode"}'])


def test_replay_discard_forgets_samples_of_undone_versions():
    from slipstream.schedule.replay import ReplayBuffer

    buf = ReplayBuffer()
    buf.add(group([1, 2], reward=1.0))
    g = group([5, 6], reward=1.0)
    g.samples[0].completion_tokens = [3, 3]
    buf.add(g)
    assert len(buf) == 2
    assert buf.discard(lambda s: undone(Group(g.prompt, [s]), 4, 6)) == 1
    assert [s.versions_T for s in buf.successes("p")] == [[1, 2]]


def test_spike_without_the_watchdog_is_injected_and_nothing_else(tmp_path):
    wd, t, _ = watchdog(tmp_path, inject_lr_spike_at=1, inject_lr_spike_factor=5.0)
    wd.active = False  # what make_watchdog builds for enabled = false with a spike
    wd.before_step()
    assert t.lr_scale == 5.0
    rec = record(1, **{"train/step_kl": 99.0})
    assert wd.observe(rec, []) == "" and "watchdog/alarms" not in rec


def test_the_rollback_learning_rate_climbs_back_over_healthy_steps(tmp_path):
    # one rollback halves the rate; 4 healthy steps bring it back: x 2^(1/4) a step, so
    # 0.5 -> 0.595 -> 0.707 -> 0.841 -> 1.0, and it never goes above 1
    wd, t, _ = watchdog(
        tmp_path, actions={"step_kl": "rollback"}, rollback_lr_scale=0.5,
        rollback_lr_recover_steps=4, reward_constant_steps=0,  # no groups here
    )  # fmt: skip
    wd.rollback = lambda path, last: None
    ckpt(tmp_path, 2)
    t.version = 5
    assert wd.observe(record(5, **{"train/step_kl": 1.0}), []) == "rollback"
    scales = []
    for s in range(6, 12):
        t.version = s
        wd.observe(record(s, **{"train/step_kl": 0.01}), [])
        wd.before_step()
        scales.append(round(t.lr_scale, 3))
    assert scales == [0.595, 0.707, 0.841, 1.0, 1.0, 1.0]


def test_without_recovery_the_rollback_learning_rate_stays(tmp_path):
    wd, t, _ = watchdog(
        tmp_path, actions={"step_kl": "rollback"}, rollback_lr_recover_steps=0,
        reward_constant_steps=0,
    )  # fmt: skip
    wd.rollback = lambda path, last: None
    ckpt(tmp_path, 2)
    t.version = 5
    assert wd.observe(record(5, **{"train/step_kl": 1.0}), []) == "rollback"
    for s in range(6, 30):
        wd.observe(record(s, **{"train/step_kl": 0.01}), [])
    assert wd.rollback_scale == 0.5


def test_a_run_ended_by_a_rollback_at_the_step_before_the_last_writes_its_final_checkpoint():
    """An orchestrated rollback publishes the restored weights as a version of its own: one
    at step 9 of 10 brings the version count to 10 and the run ends after step 9. That is
    the run's last step, so its checkpoint is due (it was not: step 9 is neither a multiple
    of `checkpoint.every` nor `run.steps`, and the run ended with no checkpoint of its final
    weights)."""
    from types import SimpleNamespace

    from slipstream.schedule.sync import checkpoint_due

    cfg = SimpleNamespace(run=SimpleNamespace(steps=10), checkpoint=SimpleNamespace(every=5))
    run = SimpleNamespace(cfg=cfg, trainer=SimpleNamespace(version=9))
    assert not checkpoint_due(run, None, 9)  # type: ignore[arg-type]
    run.trainer.version = 10  # the rollback at step 9 published the restored weights as 10
    assert checkpoint_due(run, None, 9)  # type: ignore[arg-type]


def test_keep_spares_the_checkpoints_later_alarms_will_target(tmp_path):
    """rollback_margin 3, keep 1, a checkpoint every step: an alarm at step 6 targets step 3,
    which the saves of steps 4 and 5 must not have pruned (they did: only the target of an
    alarm at the next step was spared, and the rollback was refused)."""
    wd, t, _ = watchdog(tmp_path, actions={"step_kl": "rollback"}, rollback_margin=3)
    model, tok = init_builtin(seed=1)
    for s in range(1, 6):
        t.version = s
        save_checkpoint(tmp_path, s, model, tok, {}, {}, keep=1, protect=wd.protected())
    t.version = 6
    wd.observe(record(6, **{"train/step_kl": 1.0}), [])
    target = wd.target()
    assert target is not None and target.name == "step_000003"
    # with no episode open, only the target and what later alarms may need are kept
    assert [p.name for p in list_checkpoints(tmp_path)] == [f"step_00000{s}" for s in (3, 4, 5)]


def test_a_later_rollback_never_restores_a_checkpoint_the_first_one_undid(tmp_path):
    """rollback_margin 3, a checkpoint every step: an alarm at step 10 rolls back to step 7,
    undoing versions 8..10; checkpoints 8 and 9 hold those undone weights. A new alarm at
    step 12 (the orchestrated loop published the restored weights as version 11) must go back
    to step 7 again, not to step 9 (newest at most 12 - 3): that would restore the weights
    the first rollback threw away. The undone checkpoints survive a resume of the watchdog."""
    wd, t, _ = watchdog(
        tmp_path, actions={"step_kl": "rollback"}, rollback_margin=3, max_rollbacks=2
    )
    done = []
    wd.rollback = lambda path, last: done.append((path.name, last))
    for s in range(1, 10):
        ckpt(tmp_path, s)
    t.version = 10
    assert wd.observe(record(10, **{"train/step_kl": 1.0}), []) == "rollback"
    assert done == [("step_000007", 10)]
    t.version = 11  # the restored weights, published as a version of their own
    assert wd.observe(record(11), []) == ""
    again = Watchdog(wd.cfg, t, tmp_path, lambda _: None)  # type: ignore[arg-type]
    again.load_state_dict(wd.state_dict())
    for w in (wd, again):
        w.rollback = lambda path, last: done.append((path.name, last))
    t.version = 12
    assert wd.observe(record(12, **{"train/step_kl": 1.0}), []) == "rollback"
    assert done[-1] == ("step_000007", 12)
    assert again.observe(record(12, **{"train/step_kl": 1.0}), []) == "rollback"
    assert done[-1] == ("step_000007", 12)
    assert 8 not in wd.protected() and 9 not in wd.protected()


def test_a_rollback_sets_the_undone_checkpoints_aside_so_a_resume_skips_them(tmp_path):
    """Killed after a rollback and before its next checkpoint, a run resumes from its newest
    checkpoint: that was step 9, of the weights the rollback undid. The undone checkpoints are
    renamed undone_step_NNNNNN: the resume takes step 7, the one restored; they stay on disk."""
    from slipstream.run.resume import latest_checkpoint

    wd, t, _ = watchdog(tmp_path, actions={"step_kl": "rollback"}, rollback_margin=3)
    wd.rollback = lambda path, last: None
    for s in range(1, 10):
        ckpt(tmp_path, s)
    t.version = 10
    assert wd.observe(record(10, **{"train/step_kl": 1.0}), []) == "rollback"
    assert latest_checkpoint(tmp_path).name == "step_000007"
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names[-2:] == ["undone_step_000008", "undone_step_000009"]
    assert [n for n in names if n.startswith("step_")][-1] == "step_000007"
