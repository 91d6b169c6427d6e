"""The planner: which sampler/trainer split, schedule and max lag for a run, and what it costs.

For every schedule preset and every allowed max lag, `plan` simulates the run (simulator.py)
and searches the sampler/trainer split: throughput against the number of sampler GPUs rises
while the samplers are the bottleneck and falls once the trainer is, so a climb from the split
the cost model says balances them (`balanced_split`) finds the peak in a few simulations. Colocated schedules (`sync`, `tail_batching`)
have no split. The recommendation is the highest throughput, except that a lower max lag
within `tolerance` of it wins: staleness costs learning (importance-ratio variance grows with
lag, the "k <= 8" rule of thumb), which a throughput number does not show.

Failures (`PlanRequest.failures`) count once, as in the run's duration (`slipstream plan`): the
steps are simulated without them, and every candidate's throughput is discounted by the
long-run goodput of the recovery at MTTF = c / N (`FailureModel.goodput`), the factor the
duration is divided by. A few simulated steps would hold a failure by chance, if at all, and
their throughput already counts its downtime and redone work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slipstream.schedule.presets import PRESETS, preset
from slipstream.sim.cost import (
    DecodeModel,
    ModelShape,
    engine_slots,
    min_trainer_gpus,
    prefill_time,
    sampler_tp,
    train_time,
    weight_sync_time,
)
from slipstream.sim.failures import FailureModel
from slipstream.sim.hardware import Hardware
from slipstream.sim.simulator import (
    Cluster,
    LagPolicy,
    SimConfig,
    Workload,
    simulate,
    steady_warmup,
)


@dataclass(frozen=True)
class PlanRequest:
    """What the user has and wants to run."""

    n_gpus: int
    hardware: Hardware
    model: ModelShape
    workload: Workload
    schedules: tuple[str, ...] = tuple(PRESETS)
    max_lags: tuple[int, ...] = (1, 2, 4, 8)
    """Bounds tried for `async` and `pipeline` (`double_buffer` is always 1)."""
    lag_cap: int = 8
    """Largest max lag the user accepts: a bound or preset above it is not tried
    (`double_buffer`, K = 1, under a cap of 0)."""
    steps: int = 8
    """Steps measured per candidate, after `steady_warmup(K)` steps simulated first."""
    seed: int = 0
    failures: FailureModel | None = None
    """Discount every candidate by the long-run goodput of these failures (module doc)."""
    tolerance: float = 0.03
    """A lower max lag wins if its throughput is within this fraction of the best."""
    lag_policy: LagPolicy = "drop"
    """What the simulated trainer does with a group older than the max lag (SimConfig)."""


@dataclass
class Candidate:
    """One simulated configuration and its summary (SimResult.summary())."""

    schedule: str
    max_lag: int
    sampler_gpus: int | None
    trainer_gpus: int
    metrics: dict[str, float]

    @property
    def throughput(self) -> float:
        """Trained tokens/s over a long run: the simulated (failure-free) throughput times
        the long-run goodput (1 without failures)."""
        return self.metrics["throughput_tokens_s"] * self.metrics["goodput"]


@dataclass
class Plan:
    request: PlanRequest
    candidates: list[Candidate] = field(default_factory=list)
    """Every configuration simulated."""
    best: list[Candidate] = field(default_factory=list)
    """The best split of each (schedule, max lag), highest throughput first."""
    recommended: Candidate | None = None


def with_failures(metrics: dict[str, float], goodput: float, spare_frac: float) -> dict[str, float]:
    """A failure-free simulation's `metrics` over a long run with failures: its `goodput`,
    and a cost per token raised by the time lost and by the idle spares (`spare_frac` of the
    GPUs). The throughput stays the simulated one: `Candidate.throughput` discounts it."""
    cost = metrics["cost_per_mtok"] * (1 + spare_frac) / goodput
    return {**metrics, "goodput": goodput, "cost_per_mtok": cost}


def _evaluate(req: PlanRequest, name: str, lag: int, sampler_gpus: int | None) -> Candidate:
    cluster = Cluster(req.hardware, req.model, req.n_gpus, sampler_gpus)
    w = steady_warmup(lag)  # steps 3-8 of a deep K were its start, faster than its pace
    cfg = SimConfig(
        cluster,
        req.workload,
        preset(name, lag),
        req.steps + w,
        req.seed,
        lag_policy=req.lag_policy,
        warmup_steps=w,
    )
    metrics = simulate(cfg).summary()
    f = req.failures
    if f is not None:
        metrics = with_failures(metrics, f.goodput(req.n_gpus), f.recovery.spare_frac)
    return Candidate(name, lag, sampler_gpus, cluster.trainer_gpus, metrics)


def _splits(req: PlanRequest) -> list[int]:
    """Feasible sampler GPU counts: whole engines, and enough trainers to hold the state."""
    tp = sampler_tp(req.model, req.hardware)
    most = req.n_gpus - min_trainer_gpus(req.model, req.hardware)
    return list(range(tp, most + 1, tp))


def balanced_split(req: PlanRequest) -> int:
    """Sampler GPUs at which samplers and trainer take equally long per step, from the cost
    model alone (steady state: engines full, a slot holding the length-biased mean context)."""
    hw, model, w = req.hardware, req.model, req.workload
    tp = sampler_tp(model, hw)
    held = w.prompt_len + w.lengths.residual_mean
    slots = engine_slots(model, hw, tp, held)
    decode = DecodeModel.build(model, hw, tp)
    completion = w.batch_prompts * w.group_size * w.lengths.mean
    engine_rate = slots / decode.step_time(slots, slots * held)  # completion tokens/s
    engine_s = completion / engine_rate + w.batch_prompts * prefill_time(
        model, hw, w.prompt_len, tp
    )
    tokens = completion + w.batch_prompts * w.group_size * w.prompt_len
    mean_ctx = (w.prompt_len + w.lengths.mean) / 2
    fixed_s = weight_sync_time(model, hw)

    def gap(s: int) -> float:
        sampler_s = engine_s / max(1, s // tp)
        trainer_s = train_time(model, hw, tokens, req.n_gpus - s, mean_ctx) + fixed_s
        return sampler_s - trainer_s

    splits = _splits(req)
    return min(splits, key=lambda s: abs(gap(s))) if splits else 0


def _search_split(req: PlanRequest, name: str, lag: int, out: list[Candidate]) -> Candidate | None:
    """Best split for one (schedule, lag): start at the balanced split and climb, with steps
    of 1/32 of the GPUs, then halving down to one engine."""
    splits = _splits(req)
    if not splits:
        return None
    seen: dict[int, Candidate] = {}

    def at(i: int) -> float:
        i = min(max(i, 0), len(splits) - 1)
        if i not in seen:
            seen[i] = _evaluate(req, name, lag, splits[i])
            out.append(seen[i])
        return seen[i].throughput

    best = splits.index(balanced_split(req))
    step = max(1, len(splits) // 32)
    while True:
        at(best)
        moved = False
        for nxt in (best - step, best + step):
            if 0 <= nxt < len(splits) and at(nxt) > seen[best].throughput:
                best, moved = nxt, True
                break
        if not moved:
            if step == 1:
                return seen[best]
            step //= 2


def searched_split(req: PlanRequest, name: str, lag: int) -> int | None:
    """Sampler GPUs of the highest simulated throughput for schedule `name` at max lag
    `lag` (`_search_split`: a climb from `balanced_split`, `req.steps` steps a simulation);
    None when no split is feasible."""
    cand = _search_split(req, name, lag, [])
    return cand.sampler_gpus if cand is not None else None


def allowed_lags(name: str, req: PlanRequest) -> list[int]:
    """The max lags `req` tries for the preset `name`: a fixed-batching preset's own (0 for
    the colocated ones, 1 for `double_buffer`), else `req.max_lags`; those above
    `req.lag_cap` left out."""
    spec = preset(name)
    lags = [spec.max_lag] if spec.batching == "fixed" else list(req.max_lags)
    return [k for k in lags if k <= req.lag_cap]


def plan(req: PlanRequest) -> Plan:
    """Simulate every schedule, max lag and split allowed by `req`; recommend one."""
    result = Plan(req)
    schedules = {name: allowed_lags(name, req) for name in req.schedules}
    if req.schedules and not any(schedules.values()):
        raise ValueError(f"no schedule of {', '.join(req.schedules)} within lag cap {req.lag_cap}")
    for name, lags in schedules.items():
        spec = preset(name)
        if spec.batching == "fixed" and spec.max_lag == 0 and lags:  # lags == [0]
            coloc = _evaluate(req, name, 0, None)  # colocated: every GPU samples, then trains
            result.candidates.append(coloc)
            result.best.append(coloc)
            continue
        for lag in lags:
            cand = _search_split(req, name, lag, result.candidates)
            if cand is not None:
                result.best.append(cand)
    if not result.best:
        raise ValueError("no feasible configuration: too few GPUs for this model")
    result.best.sort(key=lambda c: -c.throughput)
    top = result.best[0].throughput
    close = [c for c in result.best if c.throughput >= (1 - req.tolerance) * top]
    result.recommended = min(close, key=lambda c: (c.max_lag, -c.throughput))
    return result


def format_plan(p: Plan) -> str:
    """The best configuration of each schedule and max lag as a text table; `*` marks the
    recommendation."""
    head = (
        f"{'':1} {'schedule':14} {'lag':>3} {'samplers':>8} {'trainers':>8} {'tokens/s':>10} "
        f"{'step s':>8} {'p95 s':>8} {'smp idle':>8} {'trn idle':>8} {'lag mean':>8} "
        f"{'$/Mtok':>8} {'goodput':>7}"
    )
    lines = [head, "-" * len(head)]
    for c in p.best:
        m = c.metrics
        samplers = "coloc" if c.sampler_gpus is None else str(c.sampler_gpus)
        mark = "*" if c is p.recommended else ""
        lines.append(
            f"{mark:1} {c.schedule:14} {c.max_lag:>3} {samplers:>8} {c.trainer_gpus:>8} "
            f"{c.throughput:>10.0f} {m['step_time_mean_s']:>8.1f} {m['step_time_p95_s']:>8.1f} "
            f"{m['sampler_idle_frac']:>8.2f} {m['trainer_idle_frac']:>8.2f} {m['lag_mean']:>8.2f} "
            f"{m['cost_per_mtok']:>8.3f} {m['goodput']:>7.3f}"
        )
    return "\n".join(lines)


def plot_plan(p: Plan, path: str) -> None:
    """Throughput against sampler GPUs, one line per (schedule, lag); colocated schedules as
    horizontal lines; the recommendation starred. Writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    curves: dict[tuple[str, int], list[Candidate]] = {}
    for c in p.candidates:
        if c.sampler_gpus is None:
            ax.axhline(c.throughput, linestyle="--", linewidth=1, label=f"{c.schedule} (colocated)")
        else:
            curves.setdefault((c.schedule, c.max_lag), []).append(c)
    for (name, lag), cands in curves.items():
        cands.sort(key=lambda c: c.sampler_gpus or 0)
        ax.plot(
            [c.sampler_gpus or 0 for c in cands],
            [c.throughput for c in cands],
            marker="o",
            markersize=3,
            label=f"{name} K={lag}",
        )
    r = p.recommended
    if r is not None:
        x = r.sampler_gpus if r.sampler_gpus is not None else p.request.n_gpus
        ax.plot(
            [x],
            [r.throughput],
            marker="*",
            markersize=16,
            color="black",
            linestyle="none",
            label="recommended",
        )
    req = p.request
    ax.set_xlabel(f"sampler GPUs (of {req.n_gpus} {req.hardware.name})")
    ax.set_ylabel("trained tokens / s")
    ax.set_title(
        f"{req.model.name}: {req.workload.batch_prompts} prompts x {req.workload.group_size}"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
