"""Cluster simulation: what a schedule does on N GPUs, as a `SimResult`.

`simulate(SimConfig)` runs the discrete-event model of events.py: N GPUs split into sampler
engines (tp devices each) and a trainer pool, or colocated (every GPU samples, then trains),
running one of the five schedule presets of `slipstream.schedule.presets`, the very objects the
real orchestrator reads, with completion lengths drawn from a `LengthDist`, and optionally
failures (failures.py).

What the result says, and why each is there:

- throughput (trained tokens/s) and cost per million trained tokens;
- step time mean, spread and percentiles: a run must be reliably fast, not fast on average;
- sampler and trainer idle fractions, and sampler slot utilisation (a sampler decoding one
  straggler is busy but nearly idle);
- the lag distribution of trained samples (oldest token) and the token-mean lag;
- what became of every group (trained, dropped as stale, aborted, lost to a failure, in
  flight at the end): the counts add up, as in the real orchestrator;
- goodput: the fraction of GPU time not lost to failures (recovery, redone work).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from slipstream.schedule.presets import ScheduleSpec
from slipstream.sim.cost import (
    ModelShape,
    cost_per_million_tokens,
    engine_slots,
    sampler_tp,
)
from slipstream.sim.failures import FailureModel
from slipstream.sim.hardware import Hardware
from slipstream.sim.lengths import LengthDist

LagPolicy = Literal["keep", "drop", "abort"]


@dataclass(frozen=True)
class Cluster:
    """GPUs and what they run."""

    hardware: Hardware
    model: ModelShape
    n_gpus: int
    sampler_gpus: int | None = None
    """GPUs in sampler engines; the rest train. None: colocated (all sample, then all train)."""
    tp: int | None = None
    """Devices per sampler engine; default: fewest that fit the weights (cost.sampler_tp)."""
    slots: int | None = None
    """Sequences an engine decodes at once; default: what its KV cache holds."""

    @property
    def colocated(self) -> bool:
        return self.sampler_gpus is None

    @property
    def engine_tp(self) -> int:
        return self.tp or sampler_tp(self.model, self.hardware)

    @property
    def trainer_gpus(self) -> int:
        return self.n_gpus if self.sampler_gpus is None else self.n_gpus - self.sampler_gpus

    @property
    def n_engines(self) -> int:
        pool = self.n_gpus if self.sampler_gpus is None else self.sampler_gpus
        return pool // self.engine_tp


@dataclass(frozen=True)
class Workload:
    """What one training step consumes."""

    batch_prompts: int
    """B: groups (prompts) per optimizer step."""
    group_size: int
    """G: completions per prompt."""
    lengths: LengthDist
    prompt_len: float = 512.0
    """Prompt tokens."""
    tail_pool: int = 4
    """Tail batching sorts this many batches' worth of prompts by expected length at once."""
    prefills_per_group: float = 1.0
    """Prompt prefills per group: 1 when the G samples share it (prefix caching), G when the
    engine prefills each sample."""
    trained_frac: float | None = None
    """When set, a step trains this share of its completion tokens (a calibrated profile's
    line is per trained token: filters drop groups, prompts are not loss tokens); when unset,
    every sample's prompt and completion."""


@dataclass(frozen=True)
class SimConfig:
    cluster: Cluster
    workload: Workload
    schedule: ScheduleSpec
    steps: int = 100
    seed: int = 0
    lag_policy: LagPolicy = "drop"
    """A group older than max_lag when trained: keep it (importance-ratio corrected), drop
    it, or abort it in the sampler as soon as it crosses the bound. The default is the
    trainer's (`[schedule] lag_policy`)."""
    failures: FailureModel | None = None
    warmup_steps: int = 2
    """Steps left out of step-time and throughput statistics (the pipeline filling;
    `steady_warmup` for a schedule's steady state)."""
    drain: bool = False
    """Continuous batching admits no more groups than the steps left will train (the
    orchestrator's `min(K + 1, steps left) x B`), so the samplers drain over the last steps,
    as in a recorded run of `steps` steps (calibrate.predict); off, every step is a steady
    one (the figures and plans)."""

    def validate(self) -> None:
        c, s = self.cluster, self.schedule
        if self.steps < min_steps(self.warmup_steps):
            raise ValueError(f"steps ({self.steps}) must exceed warmup_steps ({self.warmup_steps})")
        if c.colocated and (s.max_lag != 0 or s.batching != "fixed"):
            raise ValueError(
                f"schedule {s.name!r} overlaps sampling and training: it needs separate "
                "sampler and trainer GPUs (set sampler_gpus)"
            )
        if c.trainer_gpus < 1:
            raise ValueError(f"no trainer GPUs: {c.n_gpus} GPUs, {c.sampler_gpus} sampling")
        if c.n_engines < 1:
            raise ValueError(f"no sampler engine: an engine needs {c.engine_tp} GPUs")
        if self.workload.batch_prompts < 1 or self.workload.group_size < 1:
            raise ValueError("batch_prompts and group_size must be >= 1")
        if self.lag_policy not in ("keep", "drop", "abort"):
            raise ValueError(f"lag_policy must be keep, drop or abort, got {self.lag_policy!r}")

    def engine_slots(self) -> int:
        c, w = self.cluster, self.workload
        if c.slots:
            return c.slots
        held = w.prompt_len + w.lengths.residual_mean
        return engine_slots(c.model, c.hardware, c.engine_tp, held)


@dataclass
class SimResult:
    """What a simulated run did. Seconds, tokens, fractions in [0, 1]."""

    config: SimConfig
    step_end_s: np.ndarray
    """Wall time at which each kept optimizer step ended, [steps + 1] with 0 first."""
    step_tokens: np.ndarray
    """Tokens (prompt + completion) trained by each kept step, [steps]."""
    sampler_busy_frac: float
    sampler_slot_util: float
    trainer_busy_frac: float
    lag_counts: dict[int, int]
    """Trained samples by lag of their oldest token."""
    token_lag_mean: float
    """Token-weighted mean lag of each token's own weights (in-flight updates lower it)."""
    sample_lag_token_mean: float
    """Token-weighted mean lag of each token's sample's oldest token."""
    groups: dict[str, int] = field(default_factory=dict)
    failures: int = 0
    lost_gpu_s: float = 0.0
    engine_slots: int = 0

    @property
    def wall_s(self) -> float:
        return float(self.step_end_s[-1])

    @property
    def step_times_s(self) -> np.ndarray:
        """Durations of the steps after warm-up."""
        return np.diff(self.step_end_s)[self.config.warmup_steps :]

    @property
    def throughput_tokens_s(self) -> float:
        """Trained tokens per second after warm-up."""
        w = self.config.warmup_steps
        span = self.step_end_s[-1] - self.step_end_s[w]
        return float(self.step_tokens[w:].sum() / span) if span > 0 else 0.0

    @property
    def goodput(self) -> float:
        gpu_s = self.config.cluster.n_gpus * self.wall_s
        return 1.0 - self.lost_gpu_s / gpu_s if gpu_s > 0 else 1.0

    @property
    def lag_mean(self) -> float:
        n = sum(self.lag_counts.values())
        return sum(k * v for k, v in self.lag_counts.items()) / n if n else 0.0

    @property
    def lag_max(self) -> int:
        return max(self.lag_counts, default=0)

    @property
    def cost_per_mtok(self) -> float:
        """Dollars per million trained tokens, spare GPUs included."""
        c, f = self.config.cluster, self.config.failures
        spares = c.n_gpus * f.recovery.spare_frac if f else 0.0
        tokens = float(self.step_tokens.sum())
        return cost_per_million_tokens(
            c.hardware.price_per_hour, c.n_gpus + spares, self.wall_s, tokens
        )

    def summary(self) -> dict[str, float]:
        """The headline numbers, flat, for tables and JSON."""
        st = self.step_times_s
        return {
            "throughput_tokens_s": self.throughput_tokens_s,
            "step_time_mean_s": float(st.mean()),
            "step_time_std_s": float(st.std()),
            "step_time_p50_s": float(np.quantile(st, 0.5)),
            "step_time_p95_s": float(np.quantile(st, 0.95)),
            "sampler_idle_frac": 1.0 - self.sampler_busy_frac,
            "sampler_slot_util": self.sampler_slot_util,
            "trainer_idle_frac": 1.0 - self.trainer_busy_frac,
            "lag_mean": self.lag_mean,
            "lag_max": float(self.lag_max),
            "token_lag_mean": self.token_lag_mean,
            "goodput": self.goodput,
            "cost_per_mtok": self.cost_per_mtok,
            "wall_s": self.wall_s,
        }


def min_steps(warmup_steps: int) -> int:
    """The fewest steps a simulation that leaves its first `warmup_steps` out of the
    statistics takes: one more, so that one step is measured (`SimConfig.validate`)."""
    return warmup_steps + 1


def steady_warmup(max_lag: int) -> int:
    """Steps before a schedule of max lag K runs at its steady pace: its samplers start
    ahead, and run ahead of the trainer until the lag bound holds them, about 2K steps.
    Measured on the README's plan (128 H100s, 7B, async K = 8 on 57 sampler GPUs): 409.6k
    tokens/s over steps 3-8, 391.4k over 11-18, 356.8k over 19-26 against 357.1k over
    21-100 (0.5 % from it); pipeline K = 4 on 64: 330.0k over 11-18 against 335.7k."""
    return 2 + 2 * max_lag


def simulate(cfg: SimConfig) -> SimResult:
    """Run the discrete-event model of `cfg` for `cfg.steps` optimizer steps."""
    from slipstream.sim.events import EventLoop  # events imports the dataclasses above

    cfg.validate()
    return EventLoop(cfg).run()
