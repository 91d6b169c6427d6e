"""What the trainer and the samplers exchange, as records and protocols.

    trainer ──PromptChannel── [PromptRequest, ...] ──▶ sampler
    trainer ◀──GroupChannel── SamplerMessage ───────── sampler
    trainer ──WeightChannel── (parameters, version) ─▶ sampler   (latest value, not a queue)

Every blocking call takes a timeout: nobody waits forever, so a stop request or a dead peer
is noticed within one timeout. The local runtime implements these protocols with bounded
multiprocessing queues and shared memory; a Ray runtime implements the same ones with actor
queues and the object store, and the sampler and orchestrator code does not change.

Each sampler has its own inbox. The trainer's end of the prompt channel is a `Router` over the
inboxes: it sends each chunk to the least loaded sampler and remembers who holds which group,
so that when a sampler dies the orchestrator knows exactly which requests to issue again.
(A shared queue would not say which requests died with a sampler, and a process killed while
holding a shared queue's lock or half-way through a write would wedge every other sampler.)

A runtime (`Runtime`) starts the samplers, hosts the trainer's ends of the channels, and
replaces a dead sampler: `check()` returns the ids it restarted since the last call, with a
fresh inbox already in the router; the orchestrator then takes the dead one's requests back
from the router (`Router.down`) and issues them again.
"""

from __future__ import annotations

import importlib
import itertools
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from slipstream.engine.stats import PassSums
from slipstream.types import Group, Prompt


@dataclass(frozen=True)
class PromptRequest:
    """One group to generate: `len(seeds)` samples of `prompt`, the first `group_size` to
    finish are kept (more seeds than `group_size` means redundant rollouts)."""

    group_id: int  # unique per draw, in issue order
    prompt: Prompt
    seeds: tuple[int, ...]
    group_size: int  # G
    issue_version: int  # trainer version when the orchestrator issued it
    batch: int = -1  # fixed batching: the batch (step window) it belongs to; -1: continuous
    retries: int = 0  # times this draw was issued again after a sampler died holding it


@dataclass
class SamplerReport(PassSums):
    """A sampler's cumulative counters at time `t` (`time.perf_counter()`, which is the
    system-wide monotonic clock on Linux, so the trainer can compare it with its own), and its
    engine's forward-pass sums (PassSums, for sim.calibrate)."""

    sampler_id: int
    t: float
    t_ready: float  # when the sampler began taking work
    busy_s: float = 0.0  # generating: engine steps, scoring (not `blocked_s`)
    blocked_s: float = 0.0  # holding a message while the group queue is full
    weight_sync_s: float = 0.0  # reading the weight channel and copying into the model
    weight_loads: int = 0
    tokens_generated: int = 0
    decode_steps: int = 0
    prefill_tokens: int = 0
    cancelled_tokens: int = 0  # tokens of redundant members cancelled once G had finished
    aborted_tokens: int = 0  # tokens of groups aborted for staleness
    started: int = 0  # prompt requests with a member in the engine, in inbox order
    version: int = 0  # the weights version the sampler generates with
    # closed (kind, t0, t1) intervals since the previous report, for the timeline
    intervals: list[tuple[str, float, float]] = field(default_factory=list)


MessageKind = Literal["ready", "group", "aborted", "stats", "error"]


@dataclass
class SamplerMessage:
    """What a sampler sends the trainer.

    `ready`: built and holding the first weights. `group`: a finished, scored group for
    `request`. `aborted`: the group of `request` was cut short (staleness bound); `group` holds
    what it had. `stats`: only the report. `error`: the sampler failed; `error` is the traceback.
    """

    kind: MessageKind
    sampler_id: int
    request: PromptRequest | None = None
    group: Group | None = None
    report: SamplerReport | None = None
    error: str = ""
    # run.record_schedule: the sampler's engine events since its previous message and its
    # engine step count ({"n": steps, "ev": [...]}; schedule.record.SamplerLog)
    schedule: dict[str, Any] | None = None

    def failure(self) -> Exception:
        """An `error` message as what it raises in the trainer (`sampler_failure`)."""
        return sampler_failure(self.sampler_id, self.error)


TASK_ERROR = re.compile(r"(slipstream\.tasks\.\w+)\.(\w+): (.*)")
"""How a sampler's traceback ends on an exception of the task's (module, class, message)."""


def sampler_failure(sampler_id: int, error: str) -> Exception:
    """What a sampler's failure (`error`: its traceback) raises in the trainer: a `TaskError`
    (a bad row, a reward failing under `task.reward_errors = 'fail'`) as a TaskError with its
    one line for the user, as the in-process loop raises it; anything else as RuntimeError
    with the traceback."""
    from slipstream.tasks.jsonl import TaskError

    lines = error.strip().splitlines()
    m = TASK_ERROR.fullmatch(lines[-1]) if lines else None
    if m is not None:
        cls = getattr(importlib.import_module(m[1]), m[2], None)
        if isinstance(cls, type) and issubclass(cls, TaskError):
            return TaskError(m[3])
    return RuntimeError(f"sampler {sampler_id} failed:\n{error}")


class ChannelEnd:
    """What a queue end does when it neither gathers puts nor prefetches gets (the local
    runtime's queues): `push` has nothing to send and a get sees every message already sent.
    The Ray queue overrides both."""

    prefetch: bool = False  # True: a get sees a message only once an outstanding fetch brings it

    def push(self, force: bool = True) -> None:
        """Send the puts this end has gathered: now, or with `force` false (a busy loop's
        call) only once they have waited long enough."""

    def settling(self) -> bool:
        """Whether messages a dead sampler sent may still be on their way into this end
        (the local runtime's reader of its queue, still moving them): a get that finds
        nothing is then not yet the end of them."""
        return False


class PromptChannel(Protocol):
    """Bounded queue of prompt requests, trainer to samplers. One item is a list: a fixed-batch
    chunk travels as one item so a sampler never starts half of it."""

    prefetch: bool

    def put(self, requests: list[PromptRequest], timeout: float) -> bool:
        """False if the channel stayed full for `timeout` seconds."""
        ...

    def get(self, timeout: float) -> list[PromptRequest] | None:
        """None if nothing arrived within `timeout` seconds (0: do not wait)."""
        ...

    def depth(self) -> int: ...

    def push(self, force: bool = True) -> None: ...


class GroupChannel(Protocol):
    """Bounded queue of sampler messages, samplers to trainer."""

    prefetch: bool

    def put(self, message: SamplerMessage, timeout: float) -> bool: ...

    def get(self, timeout: float) -> SamplerMessage | None: ...

    def depth(self) -> int: ...

    def settling(self) -> bool: ...

    def push(self, force: bool = True) -> None: ...


class WeightChannel(Protocol):
    """The latest published weights and their version; readers never see a torn copy."""

    def publish(self, params: Mapping[str, torch.Tensor], version: int) -> float:
        """Copy `params` in as `version`; returns the seconds it took."""
        ...

    def version(self) -> int:
        """Latest published version (-1 before the first publish); cheap, never blocks."""
        ...

    def read(self, newer_than: int, timeout: float) -> tuple[dict[str, torch.Tensor], int] | None:
        """A consistent copy of the weights if a version newer than `newer_than` is published,
        else None. The tensors belong to the reader until its next `read`."""
        ...


class StopFlag(Protocol):
    def is_set(self) -> bool: ...

    def set(self) -> None: ...


@dataclass
class Channels:
    """Everything a sampler or the orchestrator talks through."""

    prompts: PromptChannel  # the trainer's end: a `Router` over one inbox per sampler
    groups: GroupChannel
    weights: WeightChannel
    stop: StopFlag
    num_samplers: int = 1


class Router:
    """The trainer's end of the prompt channels: one inbox per sampler.

    `put` sends a chunk whole to one sampler: the live one holding the fewest requests whose
    inbox has room. `owner` maps each group id sent to its sampler until `done` (the group came
    back); `down(i)` forgets sampler i's requests and returns their ids in the order they were
    sent (the sampler died: they must be issued again; a sampler starts requests in the order
    its inbox gives them, so one that reported starting n had started the first n); a sampler
    is live again once `up(i)` (its replacement reported ready).
    """

    prefetch = False

    def __init__(self, inboxes: list[PromptChannel]) -> None:
        self.inboxes = list(inboxes)
        self.live = [True] * len(self.inboxes)
        self.load = [0] * len(self.inboxes)
        self.owner: dict[int, int] = {}
        # per inbox, in put order, from the oldest still held: the ids before it came back and
        # are forgotten (`skipped` counts them), so this holds what is in flight, not the run
        self.sent: list[deque[int]] = [deque() for _ in self.inboxes]
        self.skipped = [0] * len(self.inboxes)

    def put(self, requests: list[PromptRequest], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            # live samplers first, least loaded first; a restarting one's inbox still queues
            order = sorted(range(len(self.inboxes)), key=lambda i: (not self.live[i], self.load[i]))
            for i in order:
                if self.inboxes[i].put(requests, timeout=0):
                    for r in requests:
                        self.owner[r.group_id] = i
                        self.sent[i].append(r.group_id)
                    self.load[i] += len(requests)
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.005, max(deadline - time.monotonic(), 0.0)))

    def get(self, timeout: float) -> list[PromptRequest] | None:  # samplers read their inboxes
        raise TypeError("the trainer's end of the prompt channels is write-only")

    def done(self, group_id: int) -> None:
        i = self.owner.pop(group_id, None)
        if i is None:
            return
        self.load[i] -= 1
        sent = self.sent[i]
        while sent and self.owner.get(sent[0]) != i:
            sent.popleft()
            self.skipped[i] += 1

    def down(self, i: int, started: int = 0) -> tuple[list[int], list[int]]:
        """Sampler `i` died having started generating the first `started` requests sent to it:
        the ids of the groups it held, as (started, not started), each in the order sent."""
        self.live[i] = False
        begun, queued = self.held(i, started)
        for g in begun + queued:
            del self.owner[g]
        self.load[i] = 0
        self.sent[i], self.skipped[i] = deque(), 0
        return begun, queued

    def held(self, i: int, started: int = 0) -> tuple[list[int], list[int]]:
        """The ids of the groups sampler `i` holds, as (started, not started), each in the
        order sent, if it had started the first `started` requests sent to it (as `down`,
        without forgetting them)."""
        begun = set(itertools.islice(self.sent[i], max(started - self.skipped[i], 0)))
        held = [g for g in self.sent[i] if self.owner.get(g) == i]
        return [g for g in held if g in begun], [g for g in held if g not in begun]

    def up(self, i: int) -> None:
        self.live[i] = True

    def push(self, force: bool = True) -> None:
        """Send now what inboxes that gather puts (Ray) hold; the orchestrator calls it after
        each round of issuing."""
        for q in self.inboxes:
            q.push(force)

    def replace(self, i: int, inbox: PromptChannel) -> None:
        """A restarted sampler's fresh inbox (the old one may hold a torn message)."""
        self.inboxes[i] = inbox

    def depth(self) -> int:
        return sum(max(q.depth(), 0) for q in self.inboxes)


class Runtime(Protocol):
    """Hosts the samplers beside the trainer (local processes, Ray actors)."""

    channels: Channels  # the trainer's ends: `prompts` is a `Router`
    num_samplers: int

    def start(self, factory: Callable[[int], Any]) -> None:
        """Start one sampler per id; `factory(i)` builds the worker where it runs."""
        ...

    def pids(self) -> list[int]:
        """Process ids of the samplers (0 for one not started yet)."""
        ...

    def check(self) -> list[int]:
        """Ids of samplers found dead and restarted since the last call; raises when a sampler
        cannot be restarted (restart budget spent)."""
        ...

    def kill(self, i: int) -> None:
        """Kill sampler `i` as a crash would (chaos tests, a sampler that stopped answering)."""
        ...

    def shutdown(self) -> None: ...
