"""A run's means over its step records, each step weighted by what it holds (its trained
tokens, its time, its episodes). Pure arithmetic, no plotting imports: `slipstream report`
(report) and the bench scripts read it, and the scripts' `--help` stays fast."""

from __future__ import annotations

from typing import Any


def number(v: object) -> float | None:
    """`v` as a float when it is a number of a JSON record (a bool is none), else None.

    Not `tasks.rewards._number` on purpose: a record's `true` is a flag, never a measurement
    to average, and a record holds no numpy scalars or tensors; a reward function's True is
    the reward 1 (TRL's `torch.tensor(rewards)`)."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def weighted_mean(pairs: list[tuple[float, float | None]]) -> float | None:
    """The mean of (value, weight) pairs weighted by the weights when every value has one and
    they add up to more than 0, else the plain mean (records from before the weight was
    recorded); None without values."""
    if not pairs:
        return None
    weights = [w for _, w in pairs if w is not None]
    total = sum(weights)
    if len(weights) < len(pairs) or total <= 0:
        return sum(v for v, _ in pairs) / len(pairs)
    return sum(v * (w or 0.0) for v, w in pairs) / total


def lag_tokens(row: dict[str, Any]) -> float | None:
    """The trained tokens a step's `staleness/lag_mean` is over: its lag histogram's counts."""
    hist = row.get("staleness/lag_hist")
    if not isinstance(hist, list):
        return None
    counts = [number(c) for c in hist]
    return None if None in counts else sum(c or 0.0 for c in counts)
