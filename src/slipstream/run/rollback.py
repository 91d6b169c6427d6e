"""The watchdog's side in a run: the watchdog made for a `Run`, and its rollbacks.

`make_watchdog` builds the run's `schedule.watchdog.Watchdog` (which decides, after each
step, whether to warn, tighten or roll back); a rollback restores a checkpoint into the live
run: `inprocess_rollback` for the in-process loop, `orchestrated_rollback` (through `Undone`)
for an orchestrated schedule, whose queued and in-flight groups of the undone versions are
discarded. A replayed run (`run.replay_run`) redoes its rollbacks with `Undone` too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slipstream.run.setup import Run
from slipstream.schedule.step_stats import discard
from slipstream.schedule.watchdog import Watchdog, checkpoint_step, undone
from slipstream.train.checkpoint import load_trainer_state, load_weights
from slipstream.types import Group

if TYPE_CHECKING:  # (only annotations: the in-process loop needs neither)
    from slipstream.run.learner import RunLearner
    from slipstream.schedule.orchestrator import Orchestrator


def make_watchdog(
    run: Run, tighten_lag: Callable[[int, dict[str, Any]], None] | None = None
) -> Watchdog | None:
    """The run's watchdog (None with `watchdog.enabled = false` and no injected spike; with
    the spike alone, one that only injects it); its rollback target is protected from
    `checkpoint.keep` (`Run.keep_steps`)."""
    c = run.cfg.watchdog
    if not c.enabled and not c.inject_lr_spike_at:
        return None
    wd = Watchdog(run.cfg.watchdog, run.trainer, run.dir, run.view.log, tighten_lag)
    run.keep_steps = wd.protected
    run.watchdog = wd  # its state goes into each checkpoint and back (run.resume)
    return wd


def restore_training(run: Run, ckpt: Path) -> None:
    """Weights and optimizer state from `ckpt` into the live model and trainer (in place, so
    the engines sharing the model see them); the version counter is left alone."""
    load_weights(run.model, ckpt / "model")
    run.trainer.opt.load_state_dict(load_trainer_state(ckpt)["optimizer"])
    run.trainer.opt.zero_grad(set_to_none=True)


def inprocess_rollback(run: Run) -> Callable[[Path, int], None]:
    """Rollback for the in-process loop: restore, and forget replayed samples of the undone
    versions (the loop holds no other queued data)."""

    def go(ckpt: Path, last_bad: int) -> None:
        restore_training(run, ckpt)
        first_bad = checkpoint_step(ckpt) + 1
        if run.replay is not None:
            run.replay.discard(lambda s: any(first_bad <= v <= last_bad for v in s.versions_T))

    return go


class Undone:
    """The policy versions rollbacks undid, `[first, last]` ranges: `rejects(group)` says
    whether a group holds a token of one (its data is discarded)."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []

    def rejects(self, group: Group) -> bool:
        return any(undone(group, lo, hi) for lo, hi in self.ranges)

    def undo(self, run: Run, ckpt: Path, last_bad: int) -> bool:
        """The trainer's side of an orchestrated rollback (live or replayed): restore `ckpt`,
        undo the versions after it up to `last_bad`, forget their replayed samples, and count
        the restored weights as a new version (samplers load only newer ones), unless the
        count is at `run.steps`: the run ends on them, and never counts more versions. True
        if it counted one (to publish)."""
        restore_training(run, ckpt)
        self.ranges.append((checkpoint_step(ckpt) + 1, last_bad))
        if run.replay is not None:
            ranges = self.ranges
            run.replay.discard(
                lambda s: any(lo <= v <= hi for lo, hi in ranges for v in s.versions_T)
            )
        if run.trainer.version >= run.cfg.run.steps:
            return False
        run.trainer.version += 1
        run.engine.version = run.eval_engine.version = run.trainer.version
        return True


def orchestrated_rollback(
    run: Run, learner: RunLearner, orch: Orchestrator
) -> Callable[[Path, int], None]:
    """Rollback for an orchestrated schedule: restore, publish the restored weights as a new
    version (none at the last step: `Undone.undo`), and discard every group with a token of
    the undone versions: those already received now, those still in flight when they arrive
    (ledger: `discarded`)."""
    done = Undone()

    def go(ckpt: Path, last_bad: int) -> None:
        if done.undo(run, ckpt, last_bad):
            learner.publish(orch.ch)
        orch.reject = done.rejects
        st = orch.state
        gone: list[Group] = []

        def keep(pairs: list[tuple[int, Group]]) -> list[tuple[int, Group]]:
            """The pairs whose group survives; the others' groups go to `gone`."""
            kept = []
            for p in pairs:
                if done.rejects(p[1]):
                    gone.append(p[1])
                else:
                    kept.append(p)
            return kept

        st.window = keep(st.window)
        for b in st.batches:
            st.batches[b] = keep(st.batches[b])
        discard(run.ledger, orch.stats, gone)
        if orch.recorder is not None:
            orch.recorder.rollback(checkpoint_step(ckpt), last_bad, gone)
        if not orch.fixed:
            st.out_of_bound += len(gone)  # their places in the admission bound are free again
        orch.issue()

    return go
