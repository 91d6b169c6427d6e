"""One sampler engine: its state, the timeline of a fixed batch, and the prompts it is fed.

`EngineState` is what events.py advances between events: a clock, a decode-step counter, the
active slots as a heap of end steps, the weights version and where it changed (for the exact
version of every token). `share_times` computes a whole fixed-batch share at once with numpy.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque

import numpy as np

from slipstream.sim.cost import DecodeModel, sum_max_linear_np
from slipstream.sim.simulator import Workload


def share_times(
    decode: DecodeModel, prompt: float, shares: list[np.ndarray], slots: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per share: (seconds, sequence-seconds) for one engine to decode those lengths (tokens),
    all queued at once, `slots` at a time, a free slot taking the next sequence at once.

    Slots are assigned in decode-step space, where a sequence of length L occupies L steps
    whatever the step time; then the step time is summed piecewise between breakpoints, where
    the active count n is fixed and the context grows by n a step. When every share fits in
    its slots (the common case) all shares are done together as one padded array.
    """
    if max(len(x) for x in shares) > slots:
        out = [_queued_share_time(decode, prompt, np.asarray(x), slots) for x in shares]
        return np.array([o[0] for o in out]), np.array([o[1] for o in out])
    m = max(len(x) for x in shares)
    ends = np.zeros((len(shares), m))
    for i, x in enumerate(shares):  # zero-length padding ends at step 0 and costs nothing
        ends[i, m - len(x) :] = x
    ends.sort(axis=1)
    prev = np.concatenate([np.zeros((len(shares), 1)), ends[:, :-1]], axis=1)
    k = ends - prev
    n = np.broadcast_to(m - np.arange(m, dtype=np.float64), ends.shape)
    seg = _segment_times(decode, n, n * (prompt + prev), k)
    return seg.sum(axis=1), (seg * n).sum(axis=1)


def _segment_times(
    decode: DecodeModel, n: np.ndarray, ctx: np.ndarray, k: np.ndarray
) -> np.ndarray:
    """Seconds for k steps of n sequences starting at ctx context tokens, elementwise."""
    seg = k * decode.overhead + sum_max_linear_np(
        decode.flop_seq * n + decode.flop_ctx * ctx,
        decode.flop_ctx * n,
        decode.weights + decode.kv * ctx,
        decode.kv * n,
        k,
    )
    return np.where((n > 0) & (k > 0), seg, 0.0)


def _queued_share_time(
    decode: DecodeModel, prompt: float, lengths: np.ndarray, slots: int
) -> tuple[float, float]:
    """`share_times` for one share with more sequences than slots."""
    m = len(lengths)
    starts = np.empty(m, dtype=np.int64)
    free = [0] * slots
    for i, length in enumerate(lengths.tolist()):
        s = heapq.heappop(free)
        starts[i] = s
        heapq.heappush(free, s + length)
    points = np.concatenate([starts, starts + lengths])
    order = np.argsort(points, kind="stable")
    dn = np.concatenate([np.ones(m), -np.ones(m)])[order]
    dstart = np.concatenate([starts, -starts]).astype(np.float64)[order]
    steps = points[order]
    last = np.r_[steps[1:] != steps[:-1], True]  # state after all events at a step
    n = np.cumsum(dn)[last][:-1]
    started = np.cumsum(dstart)[last][:-1]
    x = steps[last]
    k = np.diff(x).astype(np.float64)
    x = x[:-1]
    seg = _segment_times(decode, n, n * (prompt + x) - started, k)
    return float(seg.sum()), float((seg * n).sum())


class EngineState:
    """One sampler engine: a clock, a decode-step counter, the active slots, the weights."""

    __slots__ = (
        "blocked",
        "busy_s",
        "ctx",
        "down",
        "epoch",
        "groups",
        "heap",
        "idx",
        "in_share",
        "j",
        "n",
        "next_batch",
        "pending",
        "share_end",
        "slot_s",
        "swap_steps",
        "swap_versions",
        "t",
        "version",
        "waiting",
    )

    def __init__(self, idx: int) -> None:
        self.idx = idx
        self.t = 0.0  # wall time up to which this engine's work is accounted
        self.j = 0  # decode steps done, never reset (swap records refer to it)
        self.n = 0  # active sequences
        self.groups = 0  # admitted groups not finished here
        self.ctx = 0.0  # context tokens they hold
        self.heap: list[tuple[int, int]] = []  # (decode step at which it ends, sample id)
        self.pending: deque[int] = deque()  # admitted samples waiting for a slot
        self.version = 0
        self.epoch = 0
        self.busy_s = self.slot_s = 0.0
        self.blocked = self.waiting = self.in_share = self.down = False
        self.next_batch = 0
        self.share_end = 0.0
        self.swap_steps: list[int] = [0]
        self.swap_versions: list[int] = [0]

    def advance(self, decode: DecodeModel, k: int) -> None:
        """Run `k` decode steps of the current batch."""
        if k > 0 and self.n > 0:
            dt = decode.time_for_steps(self.n, self.ctx, k)
            self.t += dt
            self.busy_s += dt
            self.slot_s += self.n * dt
            self.ctx += self.n * k
        self.j += k

    def set_version(self, v: int) -> None:
        """Take weights `v` from the current decode step on."""
        self.version = v
        self.swap_steps.append(self.j)
        self.swap_versions.append(v)

    def version_sum(self, start: int, v: int) -> int:
        """Sum of the weight versions of the tokens generated from step `start` (under `v`)
        to now."""
        steps, total, cur = self.swap_steps, 0, start
        i = bisect_right(steps, start)
        while i < len(steps) and steps[i] < self.j:
            total += (steps[i] - cur) * v
            cur, v = steps[i], self.swap_versions[i]
            i += 1
        return total + (self.j - cur) * v

    def reset(self) -> None:
        """Drop everything in flight (a failure); the clock and step counter go on."""
        self.heap.clear()
        self.pending.clear()
        self.n, self.ctx, self.groups = 0, 0.0, 0
        self.epoch += 1
        self.blocked = self.waiting = self.in_share = False


class PromptSource:
    """Draws groups' lengths; for tail batching, sorts a pool of prompts by expected length."""

    def __init__(self, work: Workload, by_expected_length: bool, rng: np.random.Generator) -> None:
        self.dist, self.rng, self.G, self.B = work.lengths, rng, work.group_size, work.batch_prompts
        self.pool = work.tail_pool if by_expected_length else 1
        self.buf: deque[np.ndarray] = deque()

    def next_group(self) -> np.ndarray:
        if not self.buf:
            lengths, _ = self.dist.sample(self.rng, 256, self.G)
            self.buf.extend(lengths)
        return self.buf.popleft()

    def next_batches(self, k: int) -> np.ndarray:
        """`k` batches of lengths, [k, B, G], drawn a pool at a time; tail batching sorts
        each pool of `pool` batches by the prompts' expected lengths, so a pool runs from
        its shortest batch to its longest."""
        if self.pool == 1 and not self.dist.stratified:
            lengths, _ = self.dist.sample(self.rng, k * self.B, self.G)
            return lengths.reshape(k, self.B, self.G)
        out = []
        for _ in range(-(-k // self.pool)):
            lengths, expected = self.dist.sample(self.rng, self.pool * self.B, self.G)
            if self.pool > 1:
                lengths = lengths[np.argsort(expected, kind="stable")]
            out.append(lengths.reshape(self.pool, self.B, self.G))
        return np.concatenate(out)
