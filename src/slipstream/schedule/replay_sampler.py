"""One recorded sampler, re-executed in the replaying process (`slipstream replay`).

A `SamplerReplayer` drives a real `SamplerWorker` (the same engine, built by the same
`SamplerFactory` of run.sampler, the same scoring, cancelling and abort code) through the
events its sampler recorded (schedule.record): before engine step `c` it takes the requests
the sampler took then, hands the engine the weights it applied at step `c`, and its refill
hook returns exactly the members the engine admitted at step `c`, in the same order, so
every step computes the same rows in the same batch as the original; after step `c` the
abort rule runs where it ran, against the version it saw. The engine's own admission rule
(`defer_prefill`, which reads clocks) is off: the record says what it decided.

Weights come from `WeightStore`, filled by the replaying trainer's publishes; causality makes
them available in time: a sampler applied version v only after the trainer published it, and
the trainer only ever waits on a sampler for a message that sampler sent after everything it
had done before.

`exact` (a replay with the recorded config): any departure from the record (a request the
record admits that is not waiting, a token count that differs from the sampler's report) is
`Diverged`. Otherwise (a replay with trainer settings changed) the record is followed as far
as it fits: completions differ in length, so members admitted at a step whose slot is still
busy wait for the next free one, and an engine past its recorded steps goes on with the
weights it has.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from slipstream.engine import Request
from slipstream.engine.stats import PASS_SUMS
from slipstream.runtime.channels import PromptRequest, SamplerMessage, SamplerReport
from slipstream.schedule.sampler import SamplerWorker
from slipstream.types import Prompt


class Diverged(RuntimeError):
    """The re-execution left the record (one line saying where)."""


class WeightStore:
    """Published versions, kept while some sampler has a load of them still to replay."""

    def __init__(self, loads: list[list[int]]) -> None:
        self.weights: dict[int, dict[str, torch.Tensor]] = {}
        self.pending: defaultdict[int, int] = defaultdict(int)  # version -> loads still to do
        for seq in loads:
            for v in seq:
                self.pending[v] += 1

    def publish(self, version: int, params: dict[str, torch.Tensor]) -> None:
        if self.pending.get(version):
            self.weights[version] = {k: p.detach().clone() for k, p in params.items()}

    def take(self, version: int) -> dict[str, torch.Tensor]:
        if version not in self.weights:
            raise Diverged(f"a sampler applies version {version} before the trainer published it")
        state = self.weights[version]
        self.pending[version] -= 1
        if not self.pending[version]:
            del self.weights[version]  # the engine copies at its next step; the dict lives on
        return state


class _Groups:
    """The worker's group channel: keeps what it sends, by group id."""

    def __init__(self) -> None:
        self.sent: dict[int, SamplerMessage] = {}

    def put(self, msg: SamplerMessage, timeout: float) -> bool:
        if msg.request is not None:
            self.sent[msg.request.group_id] = msg
        return True

    def push(self, force: bool = True) -> None:
        pass


class _Weights:
    def __init__(self) -> None:
        self.latest = -1

    def version(self) -> int:
        return self.latest


class _Channels:
    def __init__(self) -> None:
        self.groups, self.weights = _Groups(), _Weights()
        self.stop = _Never()


class _Never:
    def is_set(self) -> bool:
        return False


class SamplerReplayer:
    """Re-executes sampler `worker.id`'s record; `message(...)` advances it to one of its
    recorded messages and returns what it holds then."""

    def __init__(
        self,
        worker: SamplerWorker,
        events: list[dict[str, Any]],
        prompts: dict[str, Prompt],
        weights: WeightStore,
        threads: int,
        exact: bool,
    ) -> None:
        self.w, self.prompts, self.store = worker, prompts, weights
        self.threads, self.exact = threads, exact
        self.reqs: defaultdict[int, list[dict[str, Any]]] = defaultdict(list)
        self.steps: dict[int, dict[str, Any]] = {}
        self.stale: dict[int, int] = {}
        self.taken: list[int] = []  # group ids of the requests taken, in order (inbox order)
        for e in events:
            if "engine" in e:
                shape = [worker.engine.num_slots, worker.engine.max_len]
                if e["engine"] != shape:
                    raise Diverged(f"sampler {worker.id}: engine {shape} != recorded {e['engine']}")
            elif "req" in e:
                self.reqs[e["c"]].append(e["req"])
                self.taken.append(e["req"]["g"])
            elif "stale" in e:
                self.stale[e["c"]] = e["stale"]
            else:
                self.steps[e["c"]] = e
        self.last = max([*self.steps, *self.reqs, *self.stale, -1])  # last recorded position
        self.c = 0  # engine steps done
        self.ch = _Channels()
        self._admit: deque[tuple[int, int]] = deque()
        worker.engine.refill = self._refill
        worker.engine.admission = None  # the record says when members were admitted
        worker.state.report = SamplerReport(worker.id, 0.0, 0.0)  # (`run` would set it)

    @staticmethod
    def loads(events: list[dict[str, Any]]) -> list[int]:
        return [e["load"] for e in events if "load" in e]

    # ---- advancing ----------------------------------------------------------------------
    def step(self) -> None:
        """Engine step `c` as recorded, then what the sampler did after it."""
        w, c = self.w, self.c
        for r in self.reqs.pop(c, []):
            w._admit([self._request(r)])
        ev = self.steps.pop(c, {})
        if "load" in ev:
            w.engine.load_weights(self.store.take(ev["load"]), ev["load"])
        self._admit.extend((g, m) for g, m in ev.get("admit", []))
        done = w.engine.step()
        self.c += 1
        if self._admit and self.exact:
            raise Diverged(f"sampler {w.id}: step {c} did not admit {list(self._admit)}")
        for d in done:
            w._finished(self.ch, d)  # type: ignore[arg-type]
        if self.c in self.stale:
            self.ch.weights.latest = self.stale.pop(self.c)
            w._abort_stale(self.ch)  # type: ignore[arg-type]

    def _request(self, r: dict[str, Any]) -> PromptRequest:
        prompt = self.prompts.get(r["p"])
        if prompt is None:
            raise Diverged(f"sampler {self.w.id}: prompt {r['p']!r} was never drawn")
        return PromptRequest(r["g"], prompt, tuple(r["seeds"]), r["G"], r["iv"], r["b"], r["r"])

    def _refill(self, n: int) -> list[Request]:
        """The members recorded as admitted at this step, taken out of the worker's backlog."""
        backlog = self.w.state.backlog
        out: list[Request] = []
        while self._admit and len(out) < n:
            key = self._admit[0]
            found = next((r for r in backlog if r.key == key), None)
            if found is None:  # cancelled meanwhile (a what-if replay only)
                if self.exact:
                    raise Diverged(
                        f"sampler {self.w.id}: member {key} is not waiting at step {self.c}"
                    )
                self._admit.popleft()
                continue
            backlog.remove(found)
            self._admit.popleft()
            out.append(found)
        if not self.exact and not out and not self._admit and self.c > self.last:
            out = [backlog.popleft() for _ in range(min(n, len(backlog)))]  # past the record
        # counted as the worker's own refill counts them: a group starts with its first member
        # (its report's `started`, which the replay's end reads)
        self.w.state.report.started += sum(r.key[1] == 0 for r in out)  # type: ignore[index]
        return out

    def _advance(self, done: Callable[[], bool]) -> None:
        torch.set_num_threads(self.threads)
        while not done():
            if self.c > self.last and self.w.engine.num_active == 0 and not self.w.state.backlog:
                raise Diverged(f"sampler {self.w.id}: its record ended before the message")
            self.step()

    # ---- messages -------------------------------------------------------------------------
    def group(self, gid: int) -> SamplerMessage:
        """Advance until the sampler sent group `gid`'s message (a group or aborted one)."""
        sent = self.ch.groups.sent
        self._advance(lambda: gid in sent)
        return sent.pop(gid)

    def report_at(self, n: int) -> SamplerReport:
        """Advance to `n` engine steps; the counters a message sent then carried."""
        if self.c > n and self.exact:
            raise Diverged(f"sampler {self.w.id}: at step {self.c}, past a message sent at {n}")
        self._advance(lambda: self.c >= n)
        r, s = self.w.state.report, self.w.engine.stats
        return replace(
            r,
            tokens_generated=s.tokens_generated,
            decode_steps=s.decode_steps,
            prefill_tokens=s.prefill_tokens,
            **{k: getattr(s, k) for k in PASS_SUMS},
            intervals=[],
        )
