"""Engine metrics: cumulative counters, a bounded trace of active slots, and windowed rates.

Counters only grow; a caller takes two `snapshot()`s and turns the difference into rates with
`rates(before, after, seconds)`. Nothing here reads a clock: the engine times its phases and
the caller supplies the window's wall time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, fields


@dataclass(kw_only=True)
class PassSums:
    """Sums over timed forwards for the line `seconds = a + b * rows + e * context` (PASS_SUMS),
    which sim.calibrate fits: rows = live decode rows + prompt tokens, context = keys read."""

    pass_n: float = 0.0
    pass_rows: float = 0.0
    pass_ctx: float = 0.0
    pass_s: float = 0.0
    pass_rows2: float = 0.0
    pass_rows_ctx: float = 0.0
    pass_ctx2: float = 0.0
    pass_rows_s: float = 0.0
    pass_ctx_s: float = 0.0


@dataclass
class EngineStats(PassSums):
    """Counters since the engine was created (and the forward-pass sums, PassSums)."""

    tokens_generated: int = 0  # sampled tokens (each prefill samples one, each decode row one)
    prefill_tokens: int = 0  # prompt tokens written into the cache at admission
    recompute_tokens: int = 0  # prefix tokens re-prefilled after a weight update (`recompute`)
    prefill_steps: int = 0
    decode_steps: int = 0
    active_slot_steps: int = 0  # sum over decode steps of live slots (mean = / decode_steps)
    computed_slot_steps: int = 0  # rows the decode forward ran, holes included (>= active)
    sparse_decode_steps: int = 0  # decode steps that gathered a sparse live set's keys
    graph_decode_steps: int = 0  # decode steps run as the fixed-shape step (`decode_graph`)
    deferred_admissions: int = 0  # steps that left free slots empty to batch a prefill
    # time of forward, sampling and bookkeeping; a mixed step (decode + prefill in one forward)
    # is split by token share, separate forwards (`mixed_prefill=False`) are timed exactly
    prefill_s: float = 0.0
    decode_s: float = 0.0
    weight_update_s: float = 0.0  # total pause of weight updates: copy + re-prefill
    weight_copy_s: float = 0.0  # of which: copying tensors into the parameters
    weight_pause_max_s: float = 0.0  # longest single pause
    weight_updates: int = 0
    finished: int = 0  # completions that ended by EOS or max tokens
    aborted: int = 0
    # (perf_counter time, live slots) after each step, when the engine traces; bounded so a
    # long run cannot grow it without limit (the mean is exact from the counters anyway)
    active_trace: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=100_000))

    def account(
        self,
        seconds: float,
        n_live: int | None,
        n_dec: int,
        n_pre: int,
        context: int | None = None,
    ) -> None:
        """Count one forward of `n_dec` decode rows (`n_live` of them live; None: no decode
        part) and `n_pre` prefill tokens that took `seconds`, reading `context` keys
        (`pass_context`; None: not a timing to fit, e.g. it included a graph capture)."""
        if context is not None:
            rows, c = float((n_live or 0) + n_pre), float(context)
            self.pass_n += 1
            self.pass_rows += rows
            self.pass_ctx += c
            self.pass_s += seconds
            self.pass_rows2 += rows * rows
            self.pass_rows_ctx += rows * c
            self.pass_ctx2 += c * c
            self.pass_rows_s += rows * seconds
            self.pass_ctx_s += c * seconds
        # a mixed step's time is split by token share: at these model sizes a prompt token
        # costs about what a decode token does (separate forwards measure it exactly)
        share = n_pre / (n_pre + n_dec)
        self.prefill_s += seconds * share
        self.decode_s += seconds * (1 - share)
        if n_live is not None:
            self.decode_steps += 1
            self.active_slot_steps += n_live
            self.computed_slot_steps += n_dec
        if n_pre:
            self.prefill_steps += 1
            self.prefill_tokens += n_pre

    def snapshot(self) -> dict[str, float]:
        """The counters (not the trace), for diffing."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "active_trace"}


PASS_SUMS = tuple(f.name for f in fields(PassSums))
"""The forward-pass sums, in the order of their fields: n, rows, context, seconds, rows^2,
rows * context, context^2, rows * seconds, context * seconds."""
PASS_TIMINGS = ("pass_s", "pass_rows_s", "pass_ctx_s")
"""Those that hold seconds: wall-clock measurements, which two runs of one trajectory differ in."""


def pass_context(decode_lens: Iterable[int], prefill: Iterable[tuple[int, int]]) -> int:
    """Keys one forward attends to: a decode row reads its whole sequence so far (its length,
    the token it feeds included); a prompt part of `n` tokens written from position `s` reads
    s + 1, ..., s + n keys, one row after another."""
    return sum(decode_lens) + sum(n * s + n * (n + 1) // 2 for s, n in prefill)


def rates(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Metrics of the window between two snapshots that spans `seconds` of wall time.

    `engine/tokens_per_s` counts sampled tokens only (prompt tokens are prefill work, reported
    as `engine/prefill_tokens_per_s`). `engine/active_slots_mean` is the mean number of live
    slots per decode step; `engine/prefill_frac` the share of engine time spent in prefill.
    """
    d = {k: after[k] - before[k] for k in after}
    busy = d["prefill_s"] + d["decode_s"] + d["weight_update_s"]
    return {
        "engine/tokens_per_s": d["tokens_generated"] / max(seconds, 1e-9),
        "engine/prefill_tokens_per_s": d["prefill_tokens"] / max(seconds, 1e-9),
        "engine/tokens": d["tokens_generated"],
        "engine/decode_steps": d["decode_steps"],
        "engine/active_slots_mean": d["active_slot_steps"] / max(d["decode_steps"], 1),
        "engine/prefill_s": d["prefill_s"],
        "engine/decode_s": d["decode_s"],
        "engine/prefill_frac": d["prefill_s"] / max(busy, 1e-9),
        "engine/busy_frac": busy / max(seconds, 1e-9),
        "engine/weight_updates": d["weight_updates"],
        "engine/weight_pause_s": d["weight_update_s"],
        "engine/weight_pause_mean_s": d["weight_update_s"] / max(d["weight_updates"], 1),
        "engine/recompute_tokens": d["recompute_tokens"],
        "engine/aborted": d["aborted"],
    }
