"""The trainer side of an orchestrated run: a `Run` seen through the `Learner` protocol.

Draws and seeds come from the `Run` (one draw counter, so `sync` on the local runtime draws
the same prompts with the same seeds as the in-process loop); settling, the optimizer step,
evaluation, checkpoints and the metrics sink are the ones `train_sync` uses.

With `runtime.defer_eval`, an evaluation step only snapshots the weights with its wall time,
written to `<run.dir>/eval_snapshots/` (not held in memory: a long run has many evaluation
steps); `evaluate_deferred` scores the snapshots after the run and deletes them. Evaluation
then takes no time from training beyond the write, which a time-to-accuracy benchmark needs.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from slipstream.observe.clock import EVAL_S, EVAL_START_S
from slipstream.run.resume import checkpoint
from slipstream.run.setup import Run
from slipstream.runtime.channels import Channels
from slipstream.schedule.ledger import Ledger
from slipstream.schedule.sync import (
    COUNTERS,
    checkpoint_due,
    ends_on_restored_weights,
    observe_step,
)
from slipstream.schedule.watchdog import Watchdog
from slipstream.types import Group, Prompt


class RunLearner:
    """Implements `orchestrator.Learner` over a `Run`."""

    def __init__(self, run: Run, defer_eval: bool = False, timeline: Any = None) -> None:
        self.run = run
        self.ledger: Ledger = run.ledger
        self.defer_eval = defer_eval
        self.timeline = timeline
        self.t_start = time.perf_counter()
        self.acc: float | None = None
        self.curve: list[dict[str, float]] = []  # {step, wall_s, heldout_acc}
        self._snapshots: list[tuple[int, float, Path]] = []  # (step, wall_s, weights file)
        self._mark = Counter(run.counters)  # the run's counters at the last step record
        self.eval_s = 0.0  # seconds of the latest `evaluate` (observe.clock)
        self._start_eval_s: float | None = None  # the evaluation at the start, until recorded
        self.extra_state: Callable[[], dict[str, Any]] = dict  # more for each checkpoint
        self.watchdog: Watchdog | None = None  # schedule.watchdog

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the evaluations so far (JSON): the held-out curve scored
        and, with `defer_eval`, the snapshots not scored yet (their steps, wall times, files)."""
        return {
            "heldout_curve": list(self.curve),
            "eval_snapshots": [[step, wall, path.name] for step, wall, path in self._snapshots],
        }

    def restored(self, saved: dict[str, Any], step: int) -> None:
        """The run was restored from the checkpoint of `step` (its state.json `saved`): count
        from its counters; the held-out curve and the deferred snapshots up to that step go
        on (a checkpoint without them: the accuracy at the start, if it had one, begins the
        curve); snapshots the run before the resume took after that step are deleted, since
        the resumed run takes its own."""
        self._mark = Counter(self.run.counters)
        folder = self.run.dir / "eval_snapshots"
        if "heldout_curve" in saved:
            self.curve = [dict(c) for c in saved["heldout_curve"]]
        elif saved.get("heldout_acc_start") is not None:
            self.curve.append({"step": 0, "wall_s": 0.0, "heldout_acc": saved["heldout_acc_start"]})
        kept = {name: (int(s), float(w)) for s, w, name in saved.get("eval_snapshots", [])}
        for name, (s, wall) in sorted(kept.items(), key=lambda kv: kv[1][0]):
            if s <= step and (folder / name).is_file():
                self._snapshots.append((s, wall, folder / name))
        if folder.is_dir():
            for path in folder.iterdir():
                if path.name not in kept or kept[path.name][0] > step:
                    path.unlink(missing_ok=True)

    @property
    def version(self) -> int:
        return self.run.trainer.version

    def draw(self, n: int) -> list[Prompt]:
        # the prompts alone (the ids that measured them stay here): a sampler encodes each
        # prompt it is sent once, in its own process (schedule.sampler)
        return [d.prompt for d in self.run.draw(n)]

    def group_sizes(self, prompts: list[Prompt]) -> list[int]:
        return self.run.group_sizes(prompts)

    def seeds(self, prompt: Prompt, n: int) -> list[int]:
        return self.run.seeds(n)

    def settle(self, groups: list[Group]) -> list[Group]:
        return self.run.settle(groups)

    def train(self, groups: list[Group]) -> dict[str, Any]:
        if self.watchdog is not None:
            self.watchdog.before_step()
        metrics = self.run.trainer.step(groups)
        # as the in-process loop counts them (schedule.sync): tokens in no gradient (dropped
        # as non-finite, or all of a skipped step's) are wasted
        computed, trained = metrics["tokens/computed"], metrics["tokens/trained"]
        self.run.counters["tokens/wasted"] += int(computed - trained)
        self.run.engine.version = self.run.eval_engine.version = self.run.trainer.version
        return metrics

    def publish(self, channels: Channels) -> float:
        return channels.weights.publish(dict(self.run.model.named_parameters()), self.version)

    def evaluate(self, step: int) -> float | None:
        """Held-out accuracy now, or (deferred) a snapshot to score after the run; its
        seconds in `eval_s` (step 0, the start: in the next record's `time/eval_start_s`)."""
        t0 = time.perf_counter()
        acc = self._evaluate(step, t0 - self.t_start)
        self.eval_s = time.perf_counter() - t0
        if step == 0:
            self._start_eval_s = self.eval_s
        return acc

    def _evaluate(self, step: int, wall: float) -> float | None:
        """An evaluation of a step evaluated before replaces that one: at the last step, a
        rollback's restored weights keep the step's version (`run.rollback.Undone.undo`)."""
        self.curve = [c for c in self.curve if c["step"] != step]
        self._snapshots = [s for s in self._snapshots if s[0] != step]
        if self.defer_eval:
            path = self.run.dir / "eval_snapshots" / f"step_{step:06d}.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(self.run.model.state_dict(), path)  # tied weights stay tied
            self._snapshots.append((step, wall, path))
            return None
        t0 = time.perf_counter()
        acc = self.acc = self.run.evaluate()
        if self.timeline is not None:
            self.timeline.interval(
                "trainer", "eval", t0 - self.t_start, time.perf_counter() - self.t_start
            )
        self.curve.append({"step": step, "wall_s": wall, "heldout_acc": acc})
        return acc

    def after_step(self, record: dict[str, Any], groups: list[Group]) -> None:
        run, step = self.run, record["step"]
        cfg = run.cfg
        for k in COUNTERS:  # what settling counted (tokens/wasted, replay, filters) this step
            record[k] = record.get(k, 0) + run.counters[k] - self._mark[k]
        self._mark = Counter(run.counters)
        record[EVAL_S] = 0.0  # after the record's wall_s in this loop (observe.clock)
        if step % cfg.eval.every == 0 or step == cfg.run.steps:
            acc = self.evaluate(step)
            record[EVAL_S] = self.eval_s
            if acc is not None:
                if run.heldout:  # no held-out rows: no heldout_acc (eval.sets still scored)
                    record["heldout_acc"] = acc
                record.update(run.eval_metrics)  # heldout/pass@1, heldout/mean@n, sets
        if self._start_eval_s is not None:  # inside this first record's wall_s
            record[EVAL_START_S], self._start_eval_s = self._start_eval_s, None
        observe_step(run, self.watchdog, record, groups, eval_in_wall=False)
        if ends_on_restored_weights(run, record):
            self.evaluate(self.version)  # the final accuracy is the final weights'
        run.sink.write(record)
        run.rollouts.write(step, groups)
        run.view.update(step, record)
        if checkpoint_due(run, self.watchdog, step):
            checkpoint(run, **self.extra_state())

    def evaluate_deferred(self) -> None:
        """Score the snapshots (after the run); leaves the model with its final weights. The
        files stay until `drop_snapshots` (after the summary is written), so a run killed
        meanwhile scores them again when resumed."""
        if not self._snapshots:
            return
        final = {k: v.detach().clone() for k, v in self.run.model.state_dict().items()}
        for step, wall, path in self._snapshots:  # (the engine's packed copies follow the loads)
            # on the CPU, then copied where the model is: a snapshot names the GPU that wrote
            # it, which a run resumed with another placement may not have
            snapshot = torch.load(path, weights_only=True, map_location="cpu")
            self.run.model.load_state_dict(snapshot)
            self.acc = self.run.evaluate(step)  # scored as version `step` (trainer_state)
            self.curve.append({"step": step, "wall_s": wall, "heldout_acc": self.acc})
        self.run.model.load_state_dict(final)

    def drop_snapshots(self) -> None:
        """Delete the scored snapshots' files (and their folder, if nothing else is in it)."""
        for _, _, path in self._snapshots:
            path.unlink(missing_ok=True)
        if self._snapshots:
            with contextlib.suppress(OSError):  # not empty: someone else's files, left alone
                self._snapshots[0][2].parent.rmdir()
        self._snapshots = []
