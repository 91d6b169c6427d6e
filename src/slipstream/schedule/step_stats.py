"""What an orchestrated run measures: staleness and utilisation, per step and per run.

Samplers report cumulative counters (`SamplerReport`) with each message; a step's values are
the change since the previous step record, so nothing is lost when a sampler reports late.
`runtime/sampler_busy` is generating time over the time the reports span, summed over
samplers (so it never exceeds 1); `runtime/trainer_wait` is the share of the step the trainer
spent blocked on the group queue. Clocks are `time.perf_counter()`, the system-wide monotonic
clock on Linux, so the trainer's and the samplers' readings compare.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from slipstream.algo.staleness import lag_stats
from slipstream.runtime.channels import SamplerReport
from slipstream.types import Group

COUNTERS = (
    "busy_s",
    "weight_sync_s",
    "tokens_generated",
    "decode_steps",
    "prefill_tokens",
    "cancelled_tokens",
    "aborted_tokens",
)


def group_lag(groups: list[Group], version: int, max_lag: int) -> dict[str, Any]:
    """Lag of every completion token of `groups` trained at `version`: mean, max and a
    histogram of lags 0..K and beyond (`[K + 2]` bins)."""
    rows = [s.versions_T for g in groups for s in g.samples if s.versions_T]
    if not rows:
        return {"lag_mean": 0.0, "lag_max": 0, "lag_hist": []}
    T = max(map(len, rows))
    versions = torch.full((len(rows), T), version, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, v in enumerate(rows):
        versions[i, : len(v)] = torch.tensor(v)
        mask[i, : len(v)] = True
    out = lag_stats(versions, mask, version, num_bins=max_lag + 2)
    return {"lag_mean": out["lag_mean"], "lag_max": out["lag_max"], "lag_hist": out["lag_hist"]}


def _delta(now: dict[int, SamplerReport], before: dict[int, SamplerReport]) -> dict[str, float]:
    out = dict.fromkeys(COUNTERS, 0.0)
    for i, r in now.items():
        b = before.get(i)
        for k in COUNTERS:
            out[k] += getattr(r, k) - (getattr(b, k) if b is not None else 0.0)
    out["span_s"] = sum(r.t - before[i].t for i, r in now.items() if i in before)
    return out


@dataclass
class StepStats:
    """Accumulates between step records; `record` closes a step, `summary` the run."""

    t_start: float = 0.0
    t_end: float = 0.0
    t_step: float = 0.0  # when the open step began
    wait_s: float = 0.0  # the open step's wait for groups
    wait_total: float = 0.0
    stale_tokens: int = 0  # the open step's dropped-as-stale tokens
    reports: dict[int, SamplerReport] = field(default_factory=dict)  # latest per sampler
    prev: dict[int, SamplerReport] = field(default_factory=dict)  # at the last record
    first: dict[int, SamplerReport] = field(default_factory=dict)  # at the start
    lags: list[tuple[float, int, int]] = field(default_factory=list)  # (mean, max, tokens)
    ess: list[tuple[float, float]] = field(default_factory=list)  # (token, sequence)

    def start(self) -> None:
        self.t_start = self.t_step = time.perf_counter()
        self.first, self.prev = dict(self.reports), dict(self.reports)

    def record(
        self,
        groups: list[Group],
        metrics: dict[str, Any],
        lag: dict[str, Any],
        t_train: float,
        publish_s: float,
    ) -> dict[str, Any]:
        """The step's measurements (the caller adds step, version, queue and ledger fields)."""
        now = time.perf_counter()
        step_s = now - self.t_step
        d = _delta(self.reports, self.prev)
        n = max(len(self.reports), 1)
        lens = [s.num_tokens for g in groups for s in g.samples]
        rewards = [s.reward for g in groups for s in g.samples]
        trained = float(metrics.get("tokens/trained", 0.0))
        record = {
            "wall_s": now - self.t_start,
            "step_time_s": step_s,
            "reward_mean": sum(rewards) / max(len(rewards), 1),
            **metrics,
            **{f"staleness/{k}": v for k, v in lag.items()},
            "staleness/mismatch_kl": metrics.get("train/approx_kl", 0.0),
            "runtime/sampler_busy": d["busy_s"] / d["span_s"] if d["span_s"] > 0 else 0.0,
            "runtime/trainer_wait": self.wait_s / max(step_s, 1e-9),
            "runtime/weight_sync_s": publish_s + d["weight_sync_s"] / n,
            "runtime/weight_publish_s": publish_s,
            "time/generate_s": d["busy_s"] / n,
            "time/train_s": t_train,
            "tokens/generated": d["tokens_generated"],
            "tokens/trained": trained,
            # stale, cancelled and aborted here; the learner adds what settling counted
            "tokens/wasted": self.stale_tokens + d["cancelled_tokens"] + d["aborted_tokens"],
            "tokens/cancelled": d["cancelled_tokens"],
            "engine/tokens_per_s": d["tokens_generated"] / max(step_s, 1e-9),
            "train/tokens_per_s": trained / max(t_train, 1e-9),
            "engine/decode_steps": d["decode_steps"],
            "engine/prefill_tokens": d["prefill_tokens"],
            "completion_len_mean": sum(lens) / max(len(lens), 1),
            "completion_len_max": max(lens, default=0),
            "completion_lens": lens,
        }
        self.lags.append((lag["lag_mean"], lag["lag_max"], sum(lens)))
        self.ess.append(
            (metrics.get("staleness/ess_token", 1.0), metrics.get("staleness/ess_seq", 1.0))
        )
        self.wait_total += self.wait_s
        self.prev, self.t_step, self.wait_s, self.stale_tokens = dict(self.reports), now, 0.0, 0
        return record

    def summary(self) -> dict[str, Any]:
        """Whole-run values: busy and wait shares over the loop, token-weighted mean lag, the
        largest lag trained, mean ESS over steps."""
        d = _delta(self.reports, self.first)
        wall = (self.t_end or time.perf_counter()) - self.t_start
        toks = sum(t for *_, t in self.lags) or 1
        return {
            "sampler_busy": d["busy_s"] / d["span_s"] if d["span_s"] > 0 else 0.0,
            "trainer_wait": (self.wait_total + self.wait_s) / max(wall, 1e-9),
            "lag_mean": sum(m * t for m, _, t in self.lags) / toks,
            "lag_max": max((m for _, m, _ in self.lags), default=0),
            "ess_token": sum(e for e, _ in self.ess) / max(len(self.ess), 1),
            "ess_seq": sum(e for _, e in self.ess) / max(len(self.ess), 1),
            "tokens_generated": d["tokens_generated"],
        }
