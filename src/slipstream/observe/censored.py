"""Speedups in time to a target when a run never reached it: censored at its budget.

A run that never reached the target within its budget of steps would have needed more than
its whole training time (`train_s`), so a ratio of two times to target in which one run
never reached it is known only within bounds, and a median over seeds of such ratios too.
Dropping that seed from the median instead would keep only the seeds the faster-looking
run reached, and flatter it. Pure arithmetic, no imports of the training stack: the bench
scripts read it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def ratio_bounds(
    base: float | None, base_budget: float, other: float | None, other_budget: float
) -> tuple[float, float]:
    """[low, high] of base's time to target over other's, a run that never reached the
    target (None) censored at its budget (its training time): reached by both, low = high =
    the ratio (other at 0 s: infinite, or unknown (0, inf) if base is at 0 s too); base
    never, at least base's budget over other's time; other never, at most base's time over
    other's budget; neither, unknown (0, inf)."""
    if base is not None and other is not None:
        if other > 0:
            return (base / other, base / other)
        return (math.inf, math.inf) if base > 0 else (0.0, math.inf)
    if other is not None:
        return (base_budget / other if other > 0 else math.inf, math.inf)
    if base is not None:
        return (0.0, base / max(other_budget, 1e-9))
    return (0.0, math.inf)


def median_bounds(bounds: Sequence[tuple[float, float]]) -> list[float] | None:
    """[low, high] of the median over seeds of ratios known only within bounds (the median
    is non-decreasing in each value: the median of the lows, of the highs); None: no seed."""
    if not bounds:
        return None
    return [statistics.median(lo for lo, _ in bounds), statistics.median(hi for _, hi in bounds)]


def point(bounds: Sequence[float] | None) -> float | None:
    """The figure itself where its bounds meet (every censored seed still decides it), else
    None: a point figure is never one end of a range it is not known within."""
    return bounds[0] if bounds and bounds[0] == bounds[1] and math.isfinite(bounds[0]) else None


def finite_or_none(xs: Sequence[float] | None) -> list[float | None] | None:
    """`xs` for JSON, which has no infinity: an unbounded end is None."""
    return None if xs is None else [x if math.isfinite(x) else None for x in xs]
