"""What an orchestrated run measures: staleness and utilisation, per step and per run.

Samplers report cumulative counters (`SamplerReport`) with each message; a step's values are
the change since the previous step record, so nothing is lost when a sampler reports late.
`runtime/sampler_busy` is generating time over the time the reports span, summed over
samplers (so it never exceeds 1); `runtime/sampler_blocked` the same for time a sampler held a
finished group while the group queue was full (not generating: neither busy nor useful in
goodput); `runtime/trainer_wait` is the share of the step the trainer
spent blocked on the group queue. Clocks are `time.perf_counter()`, the system-wide monotonic
clock on Linux, so the trainer's and the samplers' readings compare.

A restarted sampler counts from zero again; its reports are offset by what the dead one had
reported, so the counters stay cumulative per sampler id. Reports from a dead incarnation
(told apart by their `t_ready`) are ignored. Tokens a dead sampler had generated for groups it
never delivered are `lost_tokens` (as of its last report: a lower bound).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from slipstream.algo.staleness import lag_stats
from slipstream.engine.stats import PASS_SUMS
from slipstream.runtime.channels import SamplerReport
from slipstream.schedule.agentic import episode_metrics
from slipstream.schedule.ledger import Ledger, trained_groups
from slipstream.tasks.rewards import part_means
from slipstream.types import Group, Sample

COUNTERS = (
    "busy_s",
    "blocked_s",
    "weight_sync_s",
    "tokens_generated",
    "decode_steps",
    "prefill_tokens",
    *PASS_SUMS,
    "cancelled_tokens",
    "aborted_tokens",
)


# the run-level sums a checkpoint carries over a resume (`StepStats.totals`)
CARRIED = (
    "busy_s",
    "blocked_s",
    "span_s",
    "tokens_generated",
    "wait_s",
    "lag_x_tokens",
    "lag_tokens",
    "ess_token_sum",
    "ess_seq_sum",
    "ess_steps",
    "sampler_restarts",
    "samplers_hung",
    "tokens_lost",
    "late_groups",
    "groups_requeued",
    "restart_downtime_s",
    "chaos_kills",
    "groups_trained_twice",
)


def group_lag(groups: list[Group], version: int, max_lag: int) -> dict[str, Any]:
    """Lag of every model token of `groups` trained at `version`: mean, max and a
    histogram of lags 0..K and beyond (`[K + 2]` bins)."""
    rows = [_model_versions(s) for g in groups for s in g.samples]
    rows = [r for r in rows if r]
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


def prompt_len_mean(groups: list[Group]) -> float:
    """Mean prompt tokens of a sample of `groups` (0 without samples): the step record's
    `prompt_len_mean`, over the groups whose `completion_lens` it holds (every group the
    step generated, trained or filtered), which the simulator's calibration reads."""
    lens = [len(s.prompt_tokens) for g in groups for s in g.samples]
    return sum(lens) / len(lens) if lens else 0.0


def _model_versions(s: Sample) -> list[int]:
    """Versions of the tokens the model produced (environment tokens carry no lag)."""
    m = s.model_mask_T
    return s.versions_T if m is None else [v for v, k in zip(s.versions_T, m) if k]


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
    t_step: float = 0.0  # when the open step began (`step_begins`)
    t_record: float = 0.0  # when the last record was made (the start before the first)
    wait_s: float = 0.0  # the open step's wait for groups
    wait_total: float = 0.0
    stale_tokens: int = 0  # the open step's dropped-as-stale tokens
    discarded_tokens: int = 0  # the open step's tokens of groups a rollback's undoing discarded
    reports: dict[int, SamplerReport] = field(default_factory=dict)  # latest per sampler
    prev: dict[int, SamplerReport] = field(default_factory=dict)  # at the last record
    first: dict[int, SamplerReport] = field(default_factory=dict)  # at the start
    lags: list[tuple[float, int, int]] = field(default_factory=list)  # (mean, max, trained)
    ess: list[tuple[float, float]] = field(default_factory=list)  # (token, sequence)
    # failures
    offset: dict[int, dict[str, float]] = field(default_factory=dict)  # dead incarnations' counters
    dead_at: dict[int, float] = field(default_factory=dict)  # sampler id -> last death seen
    delivered: dict[int, int] = field(default_factory=dict)  # tokens of groups received
    lost_by: dict[int, int] = field(default_factory=dict)  # tokens lost, per sampler
    restarts: int = 0
    hung: int = 0  # samplers killed for holding work in silence
    late_groups: int = 0  # groups of lost requests that arrived anyway (dropped)
    requeued: int = 0  # requests a dead sampler had not started, sent again as they were
    downtime_s: float = 0.0  # death seen -> replacement ready, summed
    kills: int = 0  # fault injection (runtime.chaos_kills)
    trained_twice: int = 0  # groups whose (prompt, seeds) was already trained: must stay 0
    _trained: set[int] = field(default_factory=set)
    carry: dict[str, float] = field(default_factory=dict)  # a resumed run's totals before it

    def trained_keys(self, groups: list[Group]) -> None:
        """Remember what is trained, by prompt and sample seeds (one draw's identity). The set
        holds a 64-bit hash of each key, not the key: a long run trains millions of groups."""
        for g in groups:
            key = hash(
                (g.prompt.id, tuple(sorted(-1 if s.seed is None else s.seed for s in g.samples)))
            )
            self.trained_twice += key in self._trained
            self._trained.add(key)

    def add_report(self, r: SamplerReport) -> bool:
        """Take a sampler's report; False if it comes from a dead incarnation."""
        i = r.sampler_id
        if r.t_ready <= self.dead_at.get(i, float("-inf")):
            return False
        off = self.offset.get(i)
        self.reports[i] = replace(r, **{k: getattr(r, k) + off[k] for k in COUNTERS}) if off else r
        return True

    def delivered_group(self, sampler_id: int, group: Group) -> None:
        self.delivered[sampler_id] = self.delivered.get(sampler_id, 0) + group.num_tokens

    def sampler_died(self, i: int, now: float) -> int:
        """Close sampler i's incarnation; the tokens it had generated and not delivered."""
        self.restarts += 1
        self.dead_at[i] = now
        r = self.reports.get(i)
        if r is None:
            return 0
        self.offset[i] = {k: float(getattr(r, k)) for k in COUNTERS}
        lost = self.undelivered_tokens(i)
        self.lost_by[i] = self.lost_by.get(i, 0) + lost
        # its replacement has started none of the requests sent to it until it reports
        # (`started` counts per incarnation, against the router's fresh list of them)
        self.reports[i] = replace(r, started=0)
        return lost

    def undelivered_tokens(self, i: int) -> int:
        """Tokens sampler i generated (as of its last report) for groups it has not delivered,
        cancelled or aborted, and that were not already counted lost: the groups it holds."""
        r = self.reports.get(i)
        if r is None:
            return 0
        accounted = self.delivered.get(i, 0) + r.cancelled_tokens + r.aborted_tokens
        return max(int(r.tokens_generated - accounted - self.lost_by.get(i, 0)), 0)

    def sampler_back(self, i: int, now: float) -> None:
        """Sampler i's replacement reported ready."""
        if i in self.dead_at:
            self.downtime_s += max(now - self.dead_at[i], 0.0)

    @property
    def lost_tokens(self) -> int:
        return sum(self.lost_by.values())

    def start(self) -> None:
        self.t_start = self.t_step = self.t_record = time.perf_counter()
        self.first, self.prev = dict(self.reports), dict(self.reports)

    def step_begins(self) -> None:
        """The next step's clock starts now: after the evaluation at the start and after the
        evaluation and checkpoint that follow a record. Their time is in the wall clock between
        two records (`wall_s`, where `observe.clock` and the forecast find it), not in a step's
        `step_time_s`, as in the in-process loop; samplers generating meanwhile count in the
        next record's rates, taken over the whole interval since the last record."""
        self.t_step = time.perf_counter()

    def record(
        self,
        groups: list[Group],
        kept: list[Group],
        metrics: dict[str, Any],
        lag: dict[str, Any],
        t_train: float,
        publish_s: float,
    ) -> dict[str, Any]:
        """The step's measurements (the caller adds step, version, queue and ledger fields):
        of `groups`, every group settled since the last record, and of `kept`, those of them
        the step trained on."""
        now = time.perf_counter()
        step_s, span_s = now - self.t_step, now - self.t_record
        d = _delta(self.reports, self.prev)
        n = max(len(self.reports), 1)
        lens = [s.num_tokens for g in groups for s in g.samples]
        rewards = [s.reward for g in groups for s in g.samples]
        trained = float(metrics.get("tokens/trained", 0.0))
        record = {
            "wall_s": now - self.t_start,
            "step_time_s": step_s,
            "reward_mean": sum(rewards) / max(len(rewards), 1),
            **part_means(groups),  # reward/<name> of each reward function (tasks.rewards)
            **metrics,
            **{f"staleness/{k}": v for k, v in lag.items()},
            "staleness/drift_kl": metrics.get("train/approx_kl", 0.0),  # current vs sampler
            "runtime/sampler_busy": d["busy_s"] / d["span_s"] if d["span_s"] > 0 else 0.0,
            "runtime/sampler_blocked": d["blocked_s"] / d["span_s"] if d["span_s"] > 0 else 0.0,
            "runtime/trainer_wait": self.wait_s / max(step_s, 1e-9),
            "runtime/weight_sync_s": publish_s + d["weight_sync_s"] / n,
            "runtime/weight_publish_s": publish_s,
            # the trainer's time to publish, and each sampler's mean pause to take the weights in
            "weights/publish_s": publish_s,
            "weights/pause_s": d["weight_sync_s"] / n,
            "time/generate_s": d["busy_s"] / n,
            "time/train_s": t_train,
            "tokens/generated": d["tokens_generated"],
            "tokens/trained": trained,
            # stale, discarded, cancelled and aborted here; the learner adds what settling counted
            "tokens/wasted": self.stale_tokens
            + self.discarded_tokens
            + d["cancelled_tokens"]
            + d["aborted_tokens"],
            "tokens/discarded": self.discarded_tokens,  # of versions a rollback undid
            "tokens/cancelled": d["cancelled_tokens"],
            "tokens/aborted": d["aborted_tokens"],  # cut in a sampler by lag policy `abort`
            "engine/tokens_per_s": d["tokens_generated"] / max(span_s, 1e-9),
            # the trainer's speed: the tokens it computed on, a skipped step's too
            "train/tokens_per_s": metrics.get("tokens/computed", trained) / max(t_train, 1e-9),
            "engine/decode_steps": d["decode_steps"],
            "engine/prefill_tokens": d["prefill_tokens"],
            **{f"engine/{k}": d[k] for k in PASS_SUMS},
            "completion_len_mean": sum(lens) / max(len(lens), 1),
            "completion_len_max": max(lens, default=0),
            "completion_lens": lens,
            "prompt_len_mean": prompt_len_mean(groups),
            **episode_metrics(groups, trained_groups(kept, metrics)),
        }
        # weighted by the step's trained model tokens (its lag histogram counts them), as its
        # own lag_mean is: not by all it generated (filtered groups, environment tokens)
        self.lags.append((lag["lag_mean"], lag["lag_max"], sum(lag["lag_hist"])))
        self.ess.append(
            (metrics.get("staleness/ess_token", 1.0), metrics.get("staleness/ess_seq", 1.0))
        )
        self.wait_total += self.wait_s
        self.prev, self.t_step, self.t_record, self.wait_s = dict(self.reports), now, now, 0.0
        self.stale_tokens = self.discarded_tokens = 0
        return record

    def totals(self) -> dict[str, float]:
        """The run's sums so far (`CARRIED`): this process's, plus those of the segments
        before a resume (`carry`); `lag_max` is a maximum."""
        d = _delta(self.reports, self.first)
        here = {
            "busy_s": d["busy_s"],
            "blocked_s": d["blocked_s"],
            "span_s": d["span_s"],
            "tokens_generated": d["tokens_generated"],
            "wait_s": self.wait_total + self.wait_s,
            "lag_x_tokens": sum(m * t for m, _, t in self.lags),
            "lag_tokens": sum(t for *_, t in self.lags),
            "ess_token_sum": sum(e for e, _ in self.ess),
            "ess_seq_sum": sum(e for _, e in self.ess),
            "ess_steps": len(self.ess),
            "sampler_restarts": self.restarts,
            "samplers_hung": self.hung,
            "tokens_lost": self.lost_tokens,
            "late_groups": self.late_groups,
            "groups_requeued": self.requeued,
            "restart_downtime_s": self.downtime_s,
            "chaos_kills": self.kills,
            "groups_trained_twice": self.trained_twice,
        }
        out = {k: here[k] + self.carry.get(k, 0.0) for k in CARRIED}
        out["lag_max"] = max([m for _, m, _ in self.lags] + [self.carry.get("lag_max", 0)])
        return out

    def state_dict(self) -> dict[str, float]:
        """For a checkpoint: `totals()`, which a resumed run's `summary` goes on from."""
        return self.totals()

    def load_state_dict(self, d: dict[str, float]) -> None:
        """A resumed run: the totals of the run before it (`state_dict()`)."""
        self.carry = {k: float(d[k]) for k in (*CARRIED, "lag_max") if k in d}

    def summary(self) -> dict[str, float]:
        """Whole-run values, over every segment of a resumed run: busy and wait shares, the
        token-weighted mean lag, the largest lag trained, the mean ESS over steps, and the
        failure counts."""
        t = self.totals()
        wall = (self.t_end or time.perf_counter()) - self.t_start  # from the run's start
        steps = max(t["ess_steps"], 1)
        ints = ["sampler_restarts", "samplers_hung", "tokens_lost", "late_groups"]
        ints += ["groups_requeued", "chaos_kills", "groups_trained_twice", "lag_max"]
        return {
            "sampler_busy": t["busy_s"] / t["span_s"] if t["span_s"] > 0 else 0.0,
            "sampler_blocked": t["blocked_s"] / t["span_s"] if t["span_s"] > 0 else 0.0,
            "trainer_wait": t["wait_s"] / max(wall, 1e-9),
            "lag_mean": t["lag_x_tokens"] / (t["lag_tokens"] or 1),
            "ess_token": t["ess_token_sum"] / steps,
            "ess_seq": t["ess_seq_sum"] / steps,
            "tokens_generated": t["tokens_generated"],
            "busy_s": t["busy_s"],
            "restart_downtime_s": t["restart_downtime_s"],
            **{k: int(t[k]) for k in ints},
        }


def discard(ledger: Ledger, stats: StepStats, groups: Sequence[Group]) -> None:
    """Count `groups`, of policy versions a watchdog rollback undid, as dropped: in the ledger
    (`discarded`) and in the open step's tokens (`tokens/discarded`, part of `tokens/wasted`).
    The one place they are counted: a group rejected on arrival or waiting in a window when
    the rollback comes, in a run (`schedule.orchestrator`, `run.rollback`) or its replay."""
    ledger.discarded += len(groups)
    stats.discarded_tokens += sum(g.num_tokens for g in groups)


def goodput(
    records: list[dict[str, Any]],
    wall_s: float,
    samplers: int,
    lost_tokens: int = 0,
    unfinished_tokens: int = 0,
    totals: tuple[float, float] | None = None,
) -> dict[str, float]:
    """Useful time over wall time, from a run's step records.

    Useful is the trainer's optimizer steps (not a skipped step's time) plus the samplers'
    generation that reached the trainer as training data: generating time scaled by the share
    of generated tokens not wasted (filtered, stale, cancelled, aborted, lost to a failure,
    in a skipped step, or unfinished: cut off by the end of the run). The denominator is the
    wall time of every actor: the trainer and `samplers` sampler processes, or one process
    doing both in the in-process loop (`samplers = 0`). Idle time (a sampler waiting for
    weights, a trainer waiting for groups) is not useful, so sync runs score low on it too.
    `totals`: (tokens generated, generating seconds) of the whole run, where known (the
    samplers' final reports), in place of the records' sums, which end at the last step
    record.
    """
    # a skipped step (train.trainer: non-finite, or nothing to train) is no optimizer step
    train_s = sum(r.get("time/train_s", 0.0) for r in records if not r.get("train/skipped"))
    gen_s = sum(r.get("time/generate_s", 0.0) for r in records) * max(samplers, 1)
    generated = sum(r.get("tokens/generated", 0) for r in records)
    if totals is not None:
        generated, gen_s = max(generated, totals[0]), max(gen_s, totals[1])
    wasted = sum(r.get("tokens/wasted", 0) for r in records) + lost_tokens + unfinished_tokens
    useful_share = 1.0 - min(wasted / generated, 1.0) if generated else 0.0
    useful_s = train_s + gen_s * useful_share
    actor_s = wall_s * (samplers + 1 if samplers else 1)
    return {
        "goodput": useful_s / actor_s if actor_s > 0 else 0.0,
        "useful_s": useful_s,
        "actor_s": actor_s,
        "tokens_wasted": wasted,
        "tokens_lost": lost_tokens,
        "tokens_unfinished": unfinished_tokens,
    }
