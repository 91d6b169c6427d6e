"""Hardware failures: MTTF proportional to 1/N, recovery strategies, goodput.

**MTTF = c / N.** Each GPU fails independently at a constant rate, so a job on N GPUs fails N
times as often: MTTF(N) = c / N, with c in GPU-hours. One constant per source is fitted by least
squares on log MTTF (the geometric mean of N x MTTF over the source's points), which weighs a
7.9 h point and a 47.7 day point equally:

| source | points (GPUs: MTTF) | c (GPU-h) | worst fit |
| --- | --- | --- | --- |
| cluster study (Meta RSC, 11 months, A100) | 8: 47.7 d, 1,024: 7.9 h | 8,607 | 6.4 % |
| production (Llama 3.1 on 16,384 H100; SemiAnalysis at 100k) | 16,384: 3 h, 100k: 0.5 h | 49,574 | 0.9 % |
| Nebius production cluster | 3,000: 33 h | 99,000 | 0 |

The constants differ ten-fold between sources (what counts as a failure, hardware generation,
cluster hygiene), so a plan names its source; the default is the production one.

**Goodput** is useful training time over wall time. A run alternates up periods X ~ Exp(rate)
and recoveries of R hours. Checkpoints are taken every C hours of work and take w hours each;
a failure loses the work since the last completed checkpoint. Per cycle the useful time is
C x floor(X / (C + w)), whose mean is C e^{-rate P} / (1 - e^{-rate P}) with P = C + w, so

    goodput = C e^{-rate P} / (1 - e^{-rate P}) / (1 / rate + R).

For small rate x P this is (1/rate - C/2) / (1/rate + R): a failure costs R plus half a
checkpoint interval. At one failure a day with checkpoints every 30 minutes: manual recovery
(R = 2.5 h) gives 89.6 % and automated recovery (R = 45 min, Llama 3 / MegaScale) 96.0 %, the
published ~89 % and ~96 %. Hot spares with 10-minute checkpoints (R = 5 min) give 99.3 % (">95 %"),
paying for the idle spares instead. `simulate_goodput` checks the formula by Monte Carlo and gives
the spread across runs, which is what makes a run reliably fast or not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ReliabilitySource:
    """Published MTTF points of one source: `points` are (GPUs, MTTF hours)."""

    name: str
    points: tuple[tuple[int, float], ...]
    note: str


SOURCES: dict[str, ReliabilitySource] = {
    "cluster_study": ReliabilitySource(
        "cluster_study",
        ((8, 47.7 * 24), (1024, 7.9)),
        "Meta RSC reliability study: 11 months, 16K A100s, 150M GPU-hours",
    ),
    "production": ReliabilitySource(
        "production",
        ((16384, 3.0), (100_000, 0.5)),
        "Llama 3.1: 419 interruptions in 54 days on 16,384 H100s; SemiAnalysis at 100k GPUs",
    ),
    "nebius": ReliabilitySource("nebius", ((3000, 33.0),), "Nebius production cluster"),
}


def fit_reliability_constant(points: tuple[tuple[int, float], ...]) -> float:
    """c in MTTF = c / N, GPU-hours: least squares on log MTTF, i.e. geometric mean of N x MTTF."""
    return math.exp(sum(math.log(n * mttf) for n, mttf in points) / len(points))


def mttf_hours(n_gpus: float, c_gpu_hours: float) -> float:
    """Mean time to failure of a job on `n_gpus` GPUs, hours."""
    return c_gpu_hours / n_gpus


@dataclass(frozen=True)
class Recovery:
    """How a run comes back from a failure. Hours."""

    name: str
    downtime_h: float
    """Detect, replace or drain the node, restart, reload the checkpoint."""
    checkpoint_interval_h: float
    """Work between two checkpoints; a failure loses what was done since the last one."""
    checkpoint_write_h: float = 0.0
    """Training time a checkpoint blocks (0: written asynchronously)."""
    spare_frac: float = 0.0
    """Idle spare GPUs kept, as a fraction of the job's GPUs (paid for, never used)."""


RECOVERY: dict[str, Recovery] = {
    "manual": Recovery("manual", 2.5, 0.5),
    "automated": Recovery("automated", 0.75, 0.5),
    "hot_spares": Recovery("hot_spares", 5 / 60, 10 / 60, spare_frac=0.02),
}


def recovery(name: str) -> Recovery:
    """The strategy called `name` (manual, automated, hot_spares)."""
    if name not in RECOVERY:
        raise ValueError(f"unknown recovery {name!r}; valid: {', '.join(RECOVERY)}")
    return RECOVERY[name]


def goodput(rate_per_h: float, rec: Recovery) -> float:
    """Expected long-run goodput at `rate_per_h` failures per hour of running (module doc)."""
    if rate_per_h <= 0:
        c, w = rec.checkpoint_interval_h, rec.checkpoint_write_h
        return c / (c + w)
    period = rec.checkpoint_interval_h + rec.checkpoint_write_h
    x = rate_per_h * period
    useful_per_cycle = rec.checkpoint_interval_h * math.exp(-x) / -math.expm1(-x)
    return useful_per_cycle / (1 / rate_per_h + rec.downtime_h)


@dataclass(frozen=True)
class GoodputStats:
    """Goodput across simulated runs of a fixed wall-clock length."""

    mean: float
    p10: float
    p90: float
    failures_mean: float


def simulate_goodput(
    rate_per_h: float, rec: Recovery, window_h: float, runs: int = 400, seed: int = 0
) -> GoodputStats:
    """Monte Carlo of `runs` runs of `window_h` wall hours; all runs advance together, one
    up period and one recovery per round."""
    rng = np.random.default_rng(seed)
    period = rec.checkpoint_interval_h + rec.checkpoint_write_h
    wall = np.zeros(runs)
    useful = np.zeros(runs)
    failures = np.zeros(runs)
    active = np.ones(runs, dtype=bool)
    while active.any():
        up = rng.exponential(1 / rate_per_h, runs) if rate_per_h > 0 else np.full(runs, np.inf)
        left = window_h - wall
        survives = up >= left
        # A run that outlives the window keeps its partial checkpoint interval as work.
        done_work = np.where(
            survives,
            np.floor(left / period) * rec.checkpoint_interval_h
            + np.minimum(np.mod(left, period), rec.checkpoint_interval_h),
            np.floor(up / period) * rec.checkpoint_interval_h,
        )
        useful += np.where(active, done_work, 0.0)
        failures += active & ~survives
        wall = np.where(active, np.where(survives, window_h, wall + up + rec.downtime_h), wall)
        active &= wall < window_h
    frac = useful / window_h
    return GoodputStats(
        float(frac.mean()),
        float(np.quantile(frac, 0.1)),
        float(np.quantile(frac, 0.9)),
        float(failures.mean()),
    )


@dataclass(frozen=True)
class FailureModel:
    """Failures for the cluster simulator: MTTF = `c_gpu_hours` / N, recovered by `recovery`."""

    c_gpu_hours: float
    recovery: Recovery

    def rate_per_s(self, n_gpus: int) -> float:
        return n_gpus / (self.c_gpu_hours * 3600)

    def goodput(self, n_gpus: int) -> float:
        """Expected long-run goodput of a job on `n_gpus` GPUs (MTTF = c / N, `goodput`)."""
        return goodput(n_gpus / self.c_gpu_hours, self.recovery)

    @classmethod
    def from_source(cls, source: str = "production", strategy: str = "automated") -> FailureModel:
        if source not in SOURCES:
            raise ValueError(f"unknown failure source {source!r}; valid: {', '.join(SOURCES)}")
        return cls(fit_reliability_constant(SOURCES[source].points), recovery(strategy))
