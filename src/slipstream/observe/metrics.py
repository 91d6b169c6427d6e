"""Metric values that carry their reduction, so merges are exact.

A per-step number is rarely one number: a mean over micro-batches is a sum and a count, a
maximum over samplers is a maximum. Averaging averages is wrong whenever the parts differ in
size (torchtitan's reduced metrics). Each value here is a small immutable record that merges
with another of its kind by `+`; merging is associative, so any split of the same stream
(micro-batches, samplers, windows of time) gives the value one pass would give, up to float
rounding of sums.

    Mean(sum, count)   mean weighted by count (tokens, samples)
    Sum(value)         totals: tokens, seconds, counts
    Max(value)         worst case: lag_max, ratio_max, completion_len_max
    Min(value)
    Last(value, at)    gauges and cumulative counters: the value with the largest `at` wins

Pure: no I/O, no clocks. Sinks call `resolve` to turn a record of Metric values (or of plain
floats, as the loop writes today) into plain numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias


class Metric:
    """Base of the reducible values; `a + b` merges two of the same kind."""

    __slots__ = ()

    def value(self) -> float:
        raise NotImplementedError

    def _merge(self, other: Any) -> Metric:
        raise NotImplementedError

    def __add__(self, other: Metric) -> Metric:
        if type(other) is not type(self):
            raise TypeError(f"cannot merge {type(self).__name__} with {type(other).__name__}")
        return self._merge(other)

    def __radd__(self, other: Any) -> Metric:
        # Lets built-in sum() start from 0: sum([Mean(1, 1), Mean(3, 1)]) == Mean(4, 2).
        if other == 0:
            return self
        return NotImplemented


@dataclass(frozen=True, slots=True)
class Mean(Metric):
    sum: float
    count: float = 1.0

    def value(self) -> float:
        return self.sum / self.count if self.count else math.nan

    def _merge(self, other: Mean) -> Mean:
        return Mean(self.sum + other.sum, self.count + other.count)

    @classmethod
    def of(cls, mean: float, weight: float = 1.0) -> Mean:
        """A mean already computed over `weight` items (tokens, samples)."""
        return cls(mean * weight, weight)


@dataclass(frozen=True, slots=True)
class Sum(Metric):
    total: float

    def value(self) -> float:
        return float(self.total)

    def _merge(self, other: Sum) -> Sum:
        return Sum(self.total + other.total)


def _nan_safe(pick: Any, a: float, b: float) -> float:
    # A NaN part must not make the result depend on merge order (max(nan, 1) != max(1, nan)).
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return pick(a, b)


@dataclass(frozen=True, slots=True)
class Max(Metric):
    peak: float

    def value(self) -> float:
        return float(self.peak)

    def _merge(self, other: Max) -> Max:
        return Max(_nan_safe(max, self.peak, other.peak))


@dataclass(frozen=True, slots=True)
class Min(Metric):
    low: float

    def value(self) -> float:
        return float(self.low)

    def _merge(self, other: Min) -> Min:
        return Min(_nan_safe(min, self.low, other.low))


@dataclass(frozen=True, slots=True)
class Last(Metric):
    """The most recent value; `at` (a step or a time) orders parts that arrive out of order."""

    latest: float
    at: float = 0.0

    def value(self) -> float:
        return float(self.latest)

    def _merge(self, other: Last) -> Last:
        # Ties go to the right operand: in a stream merged in order, later means newer.
        return self if self.at > other.at else other


MetricSet: TypeAlias = dict[str, Metric]
"""One record of named metrics, e.g. one micro-batch's or one sampler's."""

KINDS: dict[str, type[Metric]] = {"mean": Mean, "sum": Sum, "max": Max, "min": Min, "last": Last}


def merge(parts: Iterable[Metric]) -> Metric:
    """All parts merged, in order. Raises ValueError on an empty input (no neutral element)."""
    it = iter(parts)
    try:
        acc = next(it)
    except StopIteration:
        raise ValueError("merge: no metric values to merge") from None
    for m in it:
        acc = acc + m
    return acc


def reduce_all(parts: Iterable[Mapping[str, Metric]]) -> MetricSet:
    """Merge records key by key; a key missing from some records merges over the others."""
    out: MetricSet = {}
    for part in parts:
        for k, m in part.items():
            out[k] = out[k] + m if k in out else m
    return out


def resolve(record: Mapping[str, Any]) -> dict[str, Any]:
    """Metric values replaced by their value; everything else (floats, lists) kept as is."""
    return {k: v.value() if isinstance(v, Metric) else v for k, v in record.items()}


# Reductions of the plain-float step record the sync loop writes today (schedule/sync.py),
# by name. Used by `lift` until the loop emits Metric values itself.
_LAST = ("step", "version", "wall_s", "train/lr")
_SUM = ("step_time_s", "engine/decode_steps", "engine/prefill_tokens")
_SUM_PREFIXES = ("tokens/", "time/", "engine/pass_")


def default_reduction(name: str) -> str:
    """How a metric of this name combines over time or workers when it is a plain float."""
    if name in _LAST or name.startswith("ledger/") or name.startswith("queue/"):
        return "last"  # cumulative counters and gauges: the latest reading is the state
    if name.endswith("_max") or name.endswith("/max"):
        return "max"
    if name.endswith("_min") or name.endswith("/min"):
        return "min"
    if name in _SUM or name.startswith(_SUM_PREFIXES) or name.endswith("_tokens"):
        return "sum"
    return "mean"


def lift(
    record: Mapping[str, Any],
    reductions: Mapping[str, str] | None = None,
    weight: float = 1.0,
    at: float = 0.0,
) -> MetricSet:
    """Plain numbers of a record as Metric values, so records can be merged exactly.

    `reductions` names the kind per key (e.g. algo.losses.METRIC_REDUCTIONS); other keys follow
    `default_reduction`. Means get `weight` (tokens of a micro-batch; 1 for a step), Last gets
    `at`. Metric values are kept as they are; non-numbers (lists, strings) are left out.
    """
    out: MetricSet = {}
    for k, v in record.items():
        if isinstance(v, Metric):
            out[k] = v
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        kind = (reductions or {}).get(k) or default_reduction(k)
        if kind not in KINDS:
            raise ValueError(
                f"metric {k!r}: unknown reduction {kind!r}; expected one of {sorted(KINDS)}"
            )
        v = float(v)
        if kind == "mean":
            out[k] = Mean.of(v, weight)
        elif kind == "last":
            out[k] = Last(v, at)
        else:
            out[k] = KINDS[kind](v)  # type: ignore[call-arg]
    return out
