"""The collapse watchdog (`[watchdog]`): alarms on every step, and what to do about them.

After each step the watchdog runs the alarms of `algo.alarms` on the step record and a short
history, writes `watchdog/*` into the record (so the metrics, the live view and the sinks
have them), logs a line per alarm, and takes the strongest action among the alarms that
fired (config `watchdog.actions`, default `warn`):

- `warn`: nothing more.
- `tighten`: for `tighten_steps` steps the learning rate is scaled by `tighten_lr_scale`
  and, on an orchestrated schedule, K is 0 (schedule.auto_lag.LagControl).
- `rollback`: the trainer's weights and optimizer state go back to the newest checkpoint at
  least `rollback_margin` steps older than the first alarm of the episode (alarms in steps
  less than `window` apart are one episode), the data produced by the undone policy
  versions is discarded (the orchestrator's queued groups, replayed samples), and the
  learning rate is multiplied by `rollback_lr_scale`, then climbs back geometrically over
  `rollback_lr_recover_steps` steps without an alarm (0: it stays lowered). The version
  counter goes on (samplers load only newer versions): on an orchestrated schedule the
  restored weights are published as a new version (but at the last step, where the run ends
  on them: a run counts at most `run.steps` versions), the in-process loop keeps its count.
  At most `max_rollbacks`; without a checkpoint to go back to, or past the bound, a
  rollback alarm only warns. The checkpoint a rollback would restore, and the newer ones an
  alarm at a later step would, are never deleted (`protected`), even past `checkpoint.keep`.
  The checkpoints a rollback skipped over (newer than the one it restored, of the versions it
  undid) hold the weights it threw away: they are renamed `undone_step_NNNNNN` (`set_aside`),
  so no later rollback, resume or pruning takes them, and kept to be looked at.

Events (step, alarm, message, action) go to `summary.json["watchdog"]`.

This module decides; restoring a checkpoint into a run (the watchdog's `rollback`) and making
the watchdog of a run are `run.rollback`.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slipstream.algo import alarms
from slipstream.config.watchdog import WatchdogConfig
from slipstream.train.checkpoint import PREFIX, list_checkpoints
from slipstream.train.trainer import Trainer
from slipstream.types import Group

STRENGTH = {"warn": 0, "tighten": 1, "rollback": 2}


@dataclass
class Event:
    step: int
    alarm: str
    message: str
    action: str  # what was done: warn | tighten | rollback (a refused rollback: warn)


def checkpoint_step(path: Path) -> int:
    return int(path.name.removeprefix(PREFIX))


def reward_std(groups: list[Group]) -> float:
    rewards = [s.reward for g in groups for s in g.samples]
    return statistics.pstdev(rewards) if len(rewards) > 1 else 0.0


class Watchdog:
    """Alarm state of one run. `rollback` is the loop's way to restore a checkpoint (it gets
    the checkpoint folder and the last bad version); None: rollbacks only warn."""

    def __init__(
        self,
        cfg: WatchdogConfig,
        trainer: Trainer,
        run_dir: Path,
        log: Callable[[str], None] = print,
        tighten_lag: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg, self.trainer, self.run_dir, self.log = cfg, trainer, run_dir, log
        self.tighten_lag = tighten_lag
        self.rollback: Callable[[Path, int], None] | None = None
        self.active = cfg.enabled  # False: only the injected spike (a run without a watchdog)
        trainer.measure_step_kl = cfg.enabled and cfg.step_kl_limit > 0
        n = cfg.window
        self.entropy: deque[float] = deque(maxlen=n)
        self.grad_norm: deque[float] = deque(maxlen=n + 1)
        self.reward_std: deque[float] = deque(maxlen=max(cfg.reward_constant_steps, 1))
        self.events: list[Event] = []
        self.rollbacks = 0
        self.rollback_scale = 1.0
        self.tighten_left = 0
        self.spike_left: int | None = None  # None: the injected spike has not started
        self.first_alarm: int | None = None  # step of the open episode's first alarm
        self.last_alarm = -(10**9)

    # ---- before a step ------------------------------------------------------------------------
    def before_step(self) -> None:
        """Set the trainer's learning-rate multiplier for the step about to run."""
        c, step = self.cfg, self.trainer.version + 1
        spike = 1.0
        if c.inject_lr_spike_at and self.spike_left is None and step >= c.inject_lr_spike_at:
            self.spike_left = c.inject_lr_spike_steps
            self.log(f"watchdog: injecting a learning-rate spike x{c.inject_lr_spike_factor:g}")
        if self.spike_left:
            self.spike_left -= 1
            spike = c.inject_lr_spike_factor
        tight = c.tighten_lr_scale if self.tighten_left > 0 else 1.0
        self.tighten_left = max(0, self.tighten_left - 1)
        self.trainer.lr_scale = self.rollback_scale * tight * spike

    # ---- after a step -------------------------------------------------------------------------
    def fired(self, record: dict[str, Any], groups: list[Group]) -> list[tuple[str, str]]:
        """The alarms the step `record` (trained on `groups`) sets off: (alarm, message)."""
        c = self.cfg
        ent = float(record.get("train/entropy", 0.0))
        loss = float(record.get("train/loss", 0.0))
        grad = float(record.get("train/grad_norm", 0.0))
        self.entropy.append(ent)
        self.grad_norm.append(grad)
        self.reward_std.append(reward_std(groups))
        found = {
            "entropy_drop": alarms.entropy_drop(list(self.entropy), c.entropy_drop_rate),
            "step_kl": alarms.step_kl(float(record.get("train/step_kl", 0.0)), c.step_kl_limit),
            "ess_low": alarms.ess_low(float(record.get("staleness/ess_token", 1.0)), c.ess_floor),
            "reward_constant": alarms.reward_constant(
                list(self.reward_std), c.reward_constant_steps
            ),
            "grad_spike": alarms.grad_spike(list(self.grad_norm), c.grad_spike_factor),
            "nonfinite": alarms.nonfinite(loss, grad) if c.nonfinite else None,
        }
        return [(k, m) for k, m in found.items() if m is not None]

    def observe(self, record: dict[str, Any], groups: list[Group]) -> str:
        """Check the step `record`; act; write `watchdog/*` into it. Returns the action taken
        ("" when no alarm fired)."""
        if not self.active:
            return ""
        return self._act(int(record["step"]), self.fired(record, groups), record)

    def observe_empty(self, groups: list[Group], step: int) -> str:
        """A batch that left nothing to train on: all rewards equal is `reward_constant`."""
        if not self.active or self.cfg.reward_constant_steps == 0 or reward_std(groups) >= 1e-6:
            return ""
        return self._act(step, [("reward_constant", "a batch with every reward the same")], {})

    def _act(self, step: int, found: list[tuple[str, str]], record: dict[str, Any]) -> str:
        record["watchdog/alarms"] = len(found)
        record["watchdog/rollbacks"] = self.rollbacks
        record["watchdog/lr_scale"] = self.trainer.lr_scale
        if not found:
            if step - self.last_alarm >= self.cfg.window:
                self.first_alarm = None
            self._recover()
            return ""
        if self.first_alarm is None:
            self.first_alarm = step
        self.last_alarm = step
        action: str = max(
            (self.cfg.actions.get(a, "warn") for a, _ in found), key=STRENGTH.__getitem__
        )
        if action == "rollback":
            action = self._rollback(step)
        elif action == "tighten":
            self._tighten(record)
        for alarm, message in found:
            self.events.append(Event(step, alarm, message, action))
            self.log(f"watchdog: step {step}: {alarm}: {message} -> {action}")
        record["watchdog/alarm"] = ",".join(a for a, _ in found)
        record["watchdog/action"] = action
        record["watchdog/rollbacks"] = self.rollbacks
        return action

    def _recover(self) -> None:
        """A step without an alarm: the rollbacks' learning-rate cut shrinks by one step of
        its geometric climb (each rollback's factor is undone in `rollback_lr_recover_steps`)."""
        n = self.cfg.rollback_lr_recover_steps
        if n and self.rollback_scale < 1.0:
            up = (1.0 / self.cfg.rollback_lr_scale) ** (1.0 / n)
            self.rollback_scale = min(1.0, self.rollback_scale * up)

    def _tighten(self, record: dict[str, Any]) -> None:
        """The next `tighten_steps` steps: the learning rate scaled, and K = 0 (the step
        `record`, still open, says so)."""
        self.tighten_left = self.cfg.tighten_steps
        if self.tighten_lag is not None:
            self.tighten_lag(self.cfg.tighten_steps, record)

    def _rollback(self, step: int) -> str:
        target = self.target()
        if self.rollback is None or target is None or self.rollbacks >= self.cfg.max_rollbacks:
            why = "no checkpoint before the alarm" if target is None else "max_rollbacks reached"
            self.log(f"watchdog: step {step}: rollback refused ({why})")
            return "warn"
        last_bad, restored = self.trainer.version, checkpoint_step(target)
        gone = [
            p for p in list_checkpoints(self.run_dir) if restored < checkpoint_step(p) <= last_bad
        ]
        set_aside(gone)  # before the restore: a run killed from here on resumes from `target`
        self.rollback(target, last_bad)
        self.rollbacks += 1
        self.rollback_scale *= self.cfg.rollback_lr_scale
        self.log(f"watchdog: rolled back to {target.name}; learning rate x{self.rollback_scale:g}")
        # a new episode starts from the restored weights: the old history judged other weights
        self.entropy.clear()
        self.grad_norm.clear()
        self.reward_std.clear()
        self.first_alarm, self.last_alarm = None, -(10**9)
        return "rollback"

    # ---- checkpoints --------------------------------------------------------------------------
    def target(self) -> Path | None:
        """The checkpoint a rollback restores now: the newest at least `rollback_margin`
        steps before the open episode's first alarm (or the next step, with none open); those
        of versions a rollback undid are set aside, no longer listed (`set_aside`)."""
        first = self.first_alarm if self.first_alarm is not None else self.trainer.version + 1
        cut = first - self.cfg.rollback_margin
        ok = [p for p in list_checkpoints(self.run_dir) if checkpoint_step(p) <= cut]
        return ok[-1] if ok else None

    def protected(self) -> set[int]:
        """Checkpoint steps that `checkpoint.keep` must not delete: the rollback target and,
        with no alarm episode open, every newer checkpoint, since an alarm at a later step
        will target one of them (with `rollback_margin` above `keep`, pruning them would
        leave that alarm nothing to restore). An open episode keeps its one target."""
        t = self.target()
        keep = set() if t is None else {checkpoint_step(t)}
        if self.first_alarm is None:
            cut = self.trainer.version + 1 - self.cfg.rollback_margin
            keep |= {s for p in list_checkpoints(self.run_dir) if (s := checkpoint_step(p)) > cut}
        return keep

    def hold_checkpoint(self) -> bool:
        """True while an alarm episode is open and a rollback may still come: no checkpoint
        of suspect weights is taken then."""
        can = (
            self.active
            and "rollback" in self.cfg.actions.values()
            and self.rollbacks < self.cfg.max_rollbacks
        )
        return can and self.first_alarm is not None

    def state_dict(self) -> dict[str, Any]:
        """What the watchdog's future depends on, as JSON (for checkpoints): the rollbacks
        and the learning-rate cut, the open episode, the tighten and spike counters, the
        alarms' histories and the events so far."""
        return {
            "rollbacks": self.rollbacks,
            "rollback_scale": self.rollback_scale,
            "tighten_left": self.tighten_left,
            "spike_left": self.spike_left,
            "first_alarm": self.first_alarm,
            "last_alarm": self.last_alarm,
            "entropy": list(self.entropy),
            "grad_norm": list(self.grad_norm),
            "reward_std": list(self.reward_std),
            "events": [asdict(e) for e in self.events],
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.rollbacks, self.rollback_scale = int(d["rollbacks"]), float(d["rollback_scale"])
        self.tighten_left, self.spike_left = int(d["tighten_left"]), d["spike_left"]
        self.first_alarm, self.last_alarm = d["first_alarm"], int(d["last_alarm"])
        for name in ("entropy", "grad_norm", "reward_std"):
            history: deque[float] = getattr(self, name)
            history.clear()
            history.extend(float(x) for x in d[name])
        self.events = [Event(**e) for e in d["events"]]

    def summary(self) -> dict[str, Any]:
        return {
            "alarms": len(self.events),
            "rollbacks": self.rollbacks,
            "lr_scale": self.rollback_scale,
            "events": [asdict(e) for e in self.events],
        }


UNDONE_PREFIX = "undone_"


def set_aside(ckpts: list[Path]) -> None:
    """Checkpoints of weights a rollback undid, renamed `undone_step_NNNNNN`: no resume,
    rollback or pruning takes them for the run's own (a run killed after a rollback and before
    its next checkpoint resumed from the newest, the undone weights), and they stay on disk to
    be looked at (delete them when done)."""
    for p in ckpts:  # (a folder that cannot be renamed could not take a checkpoint either)
        p.rename(p.with_name(UNDONE_PREFIX + p.name))


def undone(group: Group, first_bad: int, last_bad: int) -> bool:
    """True when a token of `group` was produced by a version in `[first_bad, last_bad]`."""
    return any(first_bad <= v <= last_bad for s in group.samples for v in s.versions_T)
