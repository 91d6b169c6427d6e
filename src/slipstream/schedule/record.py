"""The schedule record (`run.record_schedule`): the order of events that decided a run.

Not the experience replay buffer (`schedule.replay`): this records *when* things happened, so
that `slipstream replay RUN_DIR` (`run.replay_run`) can re-execute an asynchronous run in
one process, bit for bit. An asynchronous run's outcome depends on the order of events the
clocks decided: which engine step admitted which request next to which others (float results
depend on the batch a row is computed in), at which decode step each sampler took which
weights (so which version produced each token), and in which order the trainer took the
groups. Given these, everything else is a deterministic function of the config: prompts and
seeds come from the run's counters, tokens from counter-based sampling (engine.sampling),
rewards from the verifier, and the trainer's step from its groups.

Files, in `RUN_DIR/schedule/` (format `slipstream-schedule`, version `FORMAT_VERSION`):

- `meta.json`: format, version, the number of samplers, the torch thread counts of the trainer
  and the samplers, the schedule, `complete` (the run finished with no sampler restart: only a
  complete record replays) and the steps trained.
- `trainer.jsonl`: one event per line, in the order the trainer process did them:
  `{"e": "msg", "s": sampler, "k": kind, "n": engine steps, "rep": timings, "tok": tokens,
  "g": group id, "v": verdict, "ver": versions}` for every message taken from a sampler (kind
  `ready`, `stats`, `group`, `aborted`; `n` the sender's engine step count when it sent it,
  `rep` its report's clock readings, `tok` its generated-token counter, a check; for groups,
  `v` what the orchestrator did with it, `window`, `stale`, `aborted`, `discarded` or `late`, and `ver` each
  member's token versions, run-length encoded `[[version, count], ...]`); `{"e": "aged", "g"}`
  a group dropped stale when a window took it; `{"e": "rollback", "ckpt", "bad", "g"}` the
  watchdog restored checkpoint `ckpt`, undoing versions up to `bad`, and discarded the groups
  `g` waiting in windows (a group of an undone version that arrives later has the verdict
  `discarded`); and every call into the trainer:
  `{"e": "draw", "n", "ids"}`, `{"e": "sizes", "ids", "out"}`, `{"e": "seeds", "id", "n",
  "out"}`, `{"e": "settle", "g": [...]}`, `{"e": "train", "n"}`, `{"e": "publish", "version"}`,
  `{"e": "after", "step", "g": [...], "obs": {...}}` (a step record; `obs` the values observed
  on the live queues, not reproducible: `queue/depth`, `filters/extra_draws`; and under
  `schedule.max_lag = "auto"` the K it set for the next window and why, `schedule/max_lag`,
  `schedule/max_lag_reason`, since the controller reads the trainer's measured wait).
- `sampler<i>.jsonl`: sampler i's engine events, each at `c`, its engine step count then:
  `{"c", "req": {g, p, seeds, G, iv, b, r}}` a prompt request taken into its backlog,
  `{"c", "load": v, "admit": [[g, member], ...]}` engine step `c` applied version `v` and/or
  admitted those members (in slot order), `{"c", "stale": v}` the abort rule checked against
  the published version `v` after `c` steps; first `{"c": 0, "engine": [slots, max_len]}`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from slipstream.files import write_atomic
from slipstream.runtime.channels import Channels, PromptRequest, SamplerMessage
from slipstream.schedule.ledger import Ledger
from slipstream.types import Group, Prompt

if TYPE_CHECKING:  # the orchestrator imports this module
    from slipstream.schedule.orchestrator import Learner, Orchestrator

FORMAT = "slipstream-schedule"
FORMAT_VERSION = 1
TIMING_FIELDS = ("t", "t_ready", "busy_s", "blocked_s", "weight_sync_s")  # of a SamplerReport


class SamplerLog:
    """A sampler's side of the record: engine steps, requests taken, abort-rule checks. The
    events travel to the trainer with the sampler's next message (`flush`)."""

    def __init__(self, slots: int, max_len: int) -> None:
        self.steps = 0  # engine.step() calls so far
        self.version = -1  # the engine's weights version as of the last step
        # the engine's shape first: on a GPU its slots follow the free memory
        self.events: list[dict[str, Any]] = [{"c": 0, "engine": [slots, max_len]}]

    def on_step(self, version: int, keys: list[Hashable]) -> None:
        """The engine's hook: step `self.steps` ran with weights `version` (a new one was
        applied at its start: versions only grow) and admitted `keys`."""
        e: dict[str, Any] = {}
        if version != self.version:
            e["load"] = self.version = version
        if keys:
            e["admit"] = [list(cast(tuple[int, int], k)) for k in keys]  # (group id, member)
        if e:
            self.events.append({"c": self.steps, **e})
        self.steps += 1

    def requests(self, chunk: list[PromptRequest]) -> None:
        for r in chunk:
            req = {"g": r.group_id, "p": r.prompt.id, "seeds": list(r.seeds), "G": r.group_size}
            req.update(iv=r.issue_version, b=r.batch, r=r.retries)
            self.events.append({"c": self.steps, "req": req})

    def stale_check(self, latest: int) -> None:
        self.events.append({"c": self.steps, "stale": latest})

    def flush(self) -> dict[str, Any]:
        out = {"n": self.steps, "ev": self.events}
        self.events = []
        return out


def rle(versions: list[int]) -> list[list[int]]:
    """`[3, 3, 4]` -> `[[3, 2], [4, 1]]`."""
    out: list[list[int]] = []
    for v in versions:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


class ScheduleRecorder:
    """The trainer's side: writes `RUN_DIR/schedule/` as events happen (line-buffered, so a
    crashed run keeps what it recorded; its `meta.json` then says `complete: false`)."""

    def __init__(self, run_dir: Path, meta: dict[str, Any]) -> None:
        self.dir = Path(run_dir) / "schedule"
        self.dir.mkdir(parents=True, exist_ok=True)
        for old in self.dir.glob("*.jsonl"):
            old.unlink()
        self.meta = {"format": FORMAT, "version": FORMAT_VERSION, **meta, "complete": False}
        self._write_meta()
        self._trainer = open(self.dir / "trainer.jsonl", "w", buffering=1)  # noqa: SIM115
        self._samplers: dict[int, IO[str]] = {}
        self._groups: dict[int, tuple[int, Group]] = {}  # id(group) -> (group id, group)

    def _write_meta(self) -> None:
        write_atomic(self.dir / "meta.json", json.dumps(self.meta, indent=2))

    def event(self, e: str, **fields: Any) -> None:
        self._trainer.write(json.dumps({"e": e, **fields}, separators=(",", ":")) + "\n")

    def gid(self, group: Group) -> int:
        return self._groups[id(group)][0]

    def message(self, msg: SamplerMessage, verdict: str | None) -> None:
        """A message the orchestrator took (its sampler's events first), and its verdict."""
        s = msg.sampler_id
        n = -1
        if msg.schedule is not None:
            n = msg.schedule["n"]
            f = self._samplers.get(s)
            if f is None:
                f = self._samplers[s] = open(self.dir / f"sampler{s}.jsonl", "w", buffering=1)  # noqa: SIM115
            for ev in msg.schedule["ev"]:
                f.write(json.dumps(ev, separators=(",", ":")) + "\n")
        r = msg.report
        fields: dict[str, Any] = {"s": s, "k": msg.kind, "n": n}
        if r is not None:
            fields["rep"] = [getattr(r, k) for k in TIMING_FIELDS]
            fields["tok"] = r.tokens_generated
        if msg.request is not None and msg.group is not None:
            gid = msg.request.group_id
            fields.update(g=gid, v=verdict)
            if msg.kind == "group":
                fields["ver"] = [rle(x.versions_T) for x in msg.group.samples]
            if verdict == "window":
                self._groups[id(msg.group)] = (gid, msg.group)
        self.event("msg", **fields)

    def aged(self, group: Group) -> None:
        gid, _ = self._groups.pop(id(group))
        self.event("aged", g=gid)

    def rollback(self, ckpt_step: int, last_bad: int, discarded: list[Group]) -> None:
        """The watchdog rolled back to `ckpt_step`, undoing versions up to `last_bad`, and
        discarded these groups waiting in windows (a check for the replay, which redoes it)."""
        gids = [self._groups.pop(id(g))[0] for g in discarded]
        self.event("rollback", ckpt=ckpt_step, bad=last_bad, g=gids)

    def forget(self, groups: list[Group]) -> None:
        for g in groups:
            self._groups.pop(id(g), None)

    def close(self, complete: bool, **info: Any) -> None:
        self.meta.update(complete=complete, **info)
        self._write_meta()
        for f in [self._trainer, *self._samplers.values()]:
            f.close()


class RecordingLearner:
    """`orchestrator.Learner` over another one, recording every call into the trainer."""

    def __init__(self, inner: Learner, recorder: ScheduleRecorder) -> None:
        self.inner, self.rec = inner, recorder
        self.ledger: Ledger = inner.ledger  # the same object: the orchestrator counts into it
        self._settled: list[Group] = []  # since the last step: named again by its `after`

    @property
    def version(self) -> int:
        return self.inner.version

    def draw(self, n: int) -> list[Prompt]:
        out: list[Prompt] = self.inner.draw(n)
        self.rec.event("draw", n=n, ids=[p.id for p in out])
        return out

    def group_sizes(self, prompts: list[Prompt]) -> list[int]:
        out: list[int] = self.inner.group_sizes(prompts)
        self.rec.event("sizes", ids=[p.id for p in prompts], out=out)
        return out

    def seeds(self, prompt: Prompt, n: int) -> list[int]:
        out: list[int] = self.inner.seeds(prompt, n)
        self.rec.event("seeds", id=prompt.id, n=n, out=out)
        return out

    def settle(self, groups: list[Group]) -> list[Group]:
        self.rec.event("settle", g=[self.rec.gid(g) for g in groups])
        self._settled += groups
        return self.inner.settle(groups)

    def train(self, groups: list[Group]) -> dict[str, Any]:
        self.rec.event("train", n=len(groups))
        return self.inner.train(groups)

    def publish(self, channels: Channels) -> float:
        self.rec.event("publish", version=self.version)
        return self.inner.publish(channels)

    def after_step(self, record: dict[str, Any], groups: list[Group]) -> None:
        obs = {k: record[k] for k in (*OBSERVED, *DECIDED) if k in record}
        self.rec.event("after", step=record["step"], g=[self.rec.gid(g) for g in groups], obs=obs)
        # also the groups of windows that kept nothing since the last step (they reach no
        # `after_step` and are never named again): else a long run's map only grows
        self.rec.forget([*groups, *self._settled])
        self._settled = []
        self.inner.after_step(record, groups)

    def __getattr__(self, name: str) -> Any:  # evaluate, curve, extra_state, ...
        return getattr(self.inner, name)


# Step-record values observed on the live queues: recorded, and carried into the replay's
# records as they were (a replay has no queues to observe)
OBSERVED = ("queue/depth", "filters/extra_draws")
# Decisions the run's clocks took part in, carried into the replay as they were: K of the
# next window under `schedule.max_lag = "auto"` (the controller reads the trainer's wait)
DECIDED = ("schedule/max_lag", "schedule/max_lag_reason")


def attach(orch: Orchestrator, run_dir: Path, meta: dict[str, Any]) -> Callable[[bool], None]:
    """Record `orch`'s run into `run_dir/schedule/`; returns the call that closes the record
    (`complete`: the run ended normally)."""
    rec = ScheduleRecorder(run_dir, meta)
    orch.recorder = rec
    orch.learner = RecordingLearner(orch.learner, rec)

    def close(complete: bool) -> None:
        restarts = orch.stats.restarts
        rec.close(complete and restarts == 0, steps=orch.learner.version, restarts=restarts)

    return close
