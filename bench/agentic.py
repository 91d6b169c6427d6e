"""The built-in agentic task (`task.kind=builtin_tools`): sync vs pipeline vs async, swept
over the calculator latency's tail.

For each tail ratio p99/median (default 1, 10, 30; the median is `--median` seconds) and each
seed (default 0, 1, 2), the three schedules train the same config and budget. Measured per run:
time until held-out accuracy reaches `--target` (fixed before the runs) as training time,
evaluation excluded. The crossing is read on the run's held-out curve made non-decreasing
(`--crossing monotone`, the default: observe.clock.monotone_fit, the start's accuracy first),
so that one evaluation's noise above the target that later evaluations fall back from is not
a crossing; `--crossing first` takes the first evaluation at or above it, as measured; both
are reported (`time_to_target_s` follows `--crossing`, `time_to_target_first_s` /
`time_to_target_monotone_s` are each; the step record's wall clock less the held-out
evaluations it holds, observe.clock; the in-process sync loop times a record after its step's
evaluation, the orchestrated loops before it, so on the wall clock sync's would count one
evaluation more), and beside it the wall clock there (`time_to_target_wall_s`), final
accuracy, engine busy share (sync: the engine's forward time over the step time, since its
loop also waits for environments; async schedules: the sampler's generating share), mean lag
and token ESS. The orchestrated schedules (pipeline, async) defer their held-out evaluation
(`runtime.defer_eval`: a weight snapshot at the step, scored after the run): evaluated in line,
their samplers would go on generating while the trainer evaluates, and taking that evaluation
off their clock would credit them the overlap, which sync's loop cannot have.

Run: python bench/agentic.py [--tails 1,10,30] [--seeds 0,1,2] [--target 0.3 | --target-gain 0.04]
     [key=value ...]
     [--schedule-set pipeline:schedule.max_lag=2 ...]   (an override of one schedule's runs)
     (--reuse --out DIR: finished runs of the same config in DIR are read back, not retrained)
     python bench/agentic.py --tiny        (a smoke test: 2 steps, one tail, one seed)

Prints a table and ends with one JSON line: `pipeline_speedup_vs_sync` (median over seeds of
sync's time to target over pipeline's, training time, evaluation excluded, at the largest tail;
None if a run never reached the target), `pipeline_speedup_vs_sync_bounds` ([low, high] of that
median with a run that never reached the target censored at its budget: sync unreached, its
seed's ratio is at least sync's budget over pipeline's time; pipeline unreached, at most
sync's time over pipeline's budget), `pipeline_speedup_by_seed` ([low, high] a seed),
`pipeline_speedup_vs_sync_first` (the same median on the first crossings), `speedup_by_tail` ({tail: that
median}), `async_speedup_vs_sync`, `engine_busy` ({schedule: median over seeds at the largest
tail}), `engine_busy_by_tail` ({tail: {schedule: median}}), `final_acc` (and `_by_tail`), `ess_token`.
A speedup is None where a run never reached the target (see the bounds).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from slipstream.files import read_jsonl, write_atomic
from slipstream.observe.censored import finite_or_none, median_bounds, ratio_bounds
from slipstream.observe.means import lag_tokens, number, weighted_mean

SCHEDULES = ("sync", "pipeline", "async")
CROSSINGS = ("monotone", "first")
TINY = [
    "run.steps=2",
    "warmstart.max_steps=5",
    "trainer.batch_prompts=4",
    "sampling.group_size=4",
    "eval.every=2",
    "eval.num_prompts=8",
    "run.threads=1",
    "filters.zero_variance=false",  # a 5-step model solves nothing: train on it anyway
]


def run_one(
    out: Path,
    schedule: str,
    seed: int,
    median: float,
    tail: float,
    extra: list[str],
    reuse: bool = False,
) -> dict[str, Any]:
    """Train one run (or, with `reuse`, read back a finished run of the same config from
    `out`, as observe.runs.finished_summary decides)."""
    from slipstream.config import load_config
    from slipstream.observe.runs import finished_summary, with_deferred_heldout
    from slipstream.run.launch import train_async
    from slipstream.run.sync import train_sync

    # the orchestrated schedules defer evaluation: their samplers would go on generating
    # while an evaluation in line runs, work that taking evaluations off the clock would
    # give them for free; the in-process sync loop has nothing to overlap (module doc)
    defer = [] if schedule == "sync" else ["runtime.defer_eval=true"]
    cfg = load_config(None, [
        "task.kind=builtin_tools", f'run.dir="{out}"', "run.quiet=true", f"run.seed={seed}",
        f"env.tool_latency_median_s={median}", f"env.tool_latency_p99_s={median * tail}",
        f'schedule.name="{schedule}"', *defer, *extra,
    ])  # fmt: skip
    t0 = time.perf_counter()
    summary = finished_summary(cfg) if reuse else None
    if summary is not None:
        print(f"agentic: {out.name}: read back (--reuse)", flush=True)
    else:
        summary = train_sync(cfg) if schedule == "sync" else train_async(cfg)
    records = read_jsonl(out / "metrics.jsonl")
    records = with_deferred_heldout(records, summary)  # deferred: accuracies in summary.json
    return {
        "summary": summary,
        "records": records,
        "bench_wall_s": time.perf_counter() - t0,
        "eval_in_wall": schedule == "sync",  # train_sync: the in-process loop (observe.clock)
    }


def lag_counts(records: list[dict[str, Any]]) -> dict[str, int]:
    """Trained tokens by lag (versions behind the trainer), summed over the run's steps, from
    each step's `staleness/lag_hist` (token counts for lag 0, 1, ...; its last bin holds every
    lag at or above it: schedule.step_stats bins at the staleness bound + 1)."""
    out: dict[str, int] = {}
    for r in records:
        for lag, n in enumerate(r.get("staleness/lag_hist") or []):
            if n:
                out[str(lag)] = out.get(str(lag), 0) + int(n)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def busy_share(records: list[dict[str, Any]]) -> float | None:
    """The run's engine busy share (None without one): each step's (`engine/busy_frac`, else
    `runtime/sampler_busy`) weighted by its `step_time_s`, a share of the run's time, as
    `slipstream report` weights it (observe.means.weighted_mean): a plain mean over steps
    would let a short step weigh as much as one that waited seconds for a tool."""
    return weighted_mean([
        (float(b), number(r.get("step_time_s")))
        for r in records
        if (b := r.get("engine/busy_frac", r.get("runtime/sampler_busy"))) is not None
    ])  # fmt: skip


def token_lag_mean(records: list[dict[str, Any]]) -> float:
    """The run's mean lag over its trained tokens (0 without staleness records): each step's
    `staleness/lag_mean` weighted by the tokens it is over (its `staleness/lag_hist` counts),
    as summary.json's `lag_mean` and `slipstream report` weigh it (observe.means)."""
    pairs = [
        (float(r["staleness/lag_mean"]), lag_tokens(r))
        for r in records
        if "staleness/lag_mean" in r
    ]
    mean = weighted_mean(pairs)
    return 0.0 if mean is None else mean


def episode_turns_mean(records: list[dict[str, Any]]) -> float:
    """The run's mean model turns per episode (0 without episode records): each step's
    `env/turns_mean` weighted by its `env/episodes` (observe.means.weighted_mean), so a step
    of few episodes weighs as little as it holds; a plain mean over steps would not."""
    mean = weighted_mean([
        (float(r["env/turns_mean"]), number(r.get("env/episodes")))
        for r in records
        if "env/turns_mean" in r
    ])  # fmt: skip
    return 0.0 if mean is None else mean


def measures(
    res: dict[str, Any], target: float, gain: float | None = None, crossing: str = "monotone"
) -> dict[str, Any]:
    """The run's figures; its target is `target`, or with `gain` its own start's held-out
    accuracy plus `gain` (runs sharing one warm start and the evaluation's fixed seeds share
    that start, so they share the target). `crossing`: which reading of the curve
    `time_to_target_s` is (module doc); both are kept."""
    from slipstream.observe.clock import accuracy, time_to_target, training_total

    recs, s = res["records"], res["summary"]
    if gain is not None:
        target = s["heldout_acc_start"] + gain
    start = s.get("heldout_acc_start")
    hits = {
        kind: time_to_target(recs, target, res["eval_in_wall"], start, kind == "monotone")
        for kind in CROSSINGS
    }
    hit = hits[crossing]
    ess = [r["staleness/ess_token"] for r in recs if "staleness/ess_token" in r]
    return {
        "time_to_target_s": None if hit is None else hit.train_s,  # evaluation excluded
        "time_to_target_wall_s": None if hit is None else hit.wall_s,
        **{f"time_to_target_{k}_s": None if h is None else h.train_s for k, h in hits.items()},
        "final_acc": s.get("heldout_acc_end"),
        "wall_s": s.get("wall_s"),
        # the whole budget's training time, evaluation excluded (observe.clock): a sampled
        # evaluation of many episodes would otherwise weigh in the budget speedup
        "train_s": training_total(s["wall_s"], recs) if "wall_s" in s else None,
        "engine_busy": busy_share(recs),
        "lag_mean": token_lag_mean(recs),
        "lag_counts": lag_counts(recs),
        "acc_start": s.get("heldout_acc_start"),
        "ess_token": statistics.mean(ess) if ess else 1.0,
        "turns_mean": episode_turns_mean(recs),
        "ledger_balanced": s["ledger"]["balanced"],
        "target": target,
        # the held-out curve by step (step 0: the start), for the step-by-step comparison
        "curve": ([[0, start]] if start is not None else [])
        + [[int(r["step"]), a] for r in recs if (a := accuracy(r)) is not None],
    }


def speedup(
    rows: list[dict[str, Any]], base: str, other: str, tail: float, key: str = "time_to_target_s"
) -> float | None:
    """Median over seeds of base's `key` (time to target, or wall time of the whole budget)
    over other's, at `tail`; None if a run lacks it (never reached the target)."""
    ratios = []
    for seed in sorted({r["seed"] for r in rows if r["tail"] == tail}):
        t = {r["schedule"]: r[key] for r in rows if r["seed"] == seed and r["tail"] == tail}
        if t.get(base) is None or t.get(other) is None:
            return None
        ratios.append(t[base] / max(t[other], 1e-9))
    return statistics.median(ratios) if ratios else None


def paired_runs(
    rows: list[dict[str, Any]], base: str, other: str, tail: float
) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    """(seed, base's row, other's row) for each seed at `tail` that has both runs, by seed."""
    out = []
    for seed in sorted({r["seed"] for r in rows if r["tail"] == tail}):
        run = {r["schedule"]: r for r in rows if r["seed"] == seed and r["tail"] == tail}
        if base in run and other in run:
            out.append((seed, run[base], run[other]))
    return out


def seed_bounds(
    rows: list[dict[str, Any]], base: str, other: str, tail: float, key: str = "time_to_target_s"
) -> list[tuple[float, float]]:
    """Per seed at `tail`, [low, high] of base's time to target over other's, a run that
    never reached the target censored at its budget (`train_s`, training time):
    observe.censored.ratio_bounds."""
    return [
        ratio_bounds(b[key], b["train_s"], o[key], o["train_s"])
        for _, b, o in paired_runs(rows, base, other, tail)
    ]


def step_gap(
    rows: list[dict[str, Any]], base: str, other: str, tail: float
) -> dict[str, Any] | None:
    """Held-out accuracy of `other` minus `base` at the same step, averaged over the steps
    both evaluated after the start, per seed at `tail` and their mean: whether `other` learns
    less per step (its lag costing it accuracy) or the time-to-target ratio's swings are the
    curves' noise. None: no seed has both curves."""
    per_seed = {}
    for seed, run_a, run_b in paired_runs(rows, base, other, tail):
        a, b = (dict(map(tuple, r.get("curve") or [])) for r in (run_a, run_b))
        steps = {k for k in a.keys() & b.keys() if k > 0}
        if steps:
            per_seed[str(seed)] = statistics.mean(b[k] - a[k] for k in steps)
    if not per_seed:
        return None
    return {"mean": statistics.mean(per_seed.values()), "by_seed": per_seed}


def by_schedule(rows: list[dict[str, Any]], key: str, tail: float) -> dict[str, float | None]:
    """{schedule: median over the seeds of `key` at `tail`} (runs lacking it left out; None:
    no run): one tail's runs, never the tails pooled (their busy shares differ by design)."""
    return {
        s: _median(
            [
                r[key]
                for r in rows
                if r["schedule"] == s and r["tail"] == tail and r[key] is not None
            ]
        )
        for s in SCHEDULES
    }


def schedule_sets(items: list[str]) -> dict[str, list[str]]:
    """`--schedule-set SCHEDULE:KEY=VALUE` items as {schedule: [KEY=VALUE, ...]}, in order."""
    out: dict[str, list[str]] = {}
    for item in items:
        sched, sep, override = item.partition(":")
        if not sep or sched not in SCHEDULES or "=" not in override:
            raise SystemExit(
                f"agentic: --schedule-set {item!r}: expected SCHEDULE:KEY=VALUE with SCHEDULE "
                f"one of {', '.join(SCHEDULES)}"
            )
        out.setdefault(sched, []).append(override)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="key=value config overrides (every run)")
    p.add_argument("--tails", default="1,10,30", help="p99/median ratios of the tool latency")
    p.add_argument("--seeds", default="0,1,2", help="seeds at the largest tail")
    p.add_argument(
        "--sweep-seeds", default=None, help="seeds at the other tails (default: --seeds)"
    )
    p.add_argument("--median", type=float, default=0.1, help="median tool latency (s)")
    p.add_argument("--async-tails", default="30", help="tails where async runs too ('': none)")
    p.add_argument("--target", type=float, default=0.3, help="held-out accuracy to reach")
    p.add_argument(
        "--target-gain",
        type=float,
        default=None,
        help="instead of --target: each run's start held-out accuracy + this",
    )
    p.add_argument(
        "--crossing",
        choices=CROSSINGS,
        default="monotone",
        help="when a run reaches the target: its non-decreasing curve's first value at or above "
        "it (monotone), or the first evaluation at or above it (first); both are reported",
    )
    p.add_argument(
        "--schedule-set",
        action="append",
        default=[],
        metavar="SCHEDULE:KEY=VALUE",
        help="an override for one schedule's runs only (repeatable), e.g. "
        "pipeline:schedule.max_lag=2; with --reuse, the other schedules' finished runs in --out "
        "are read back",
    )
    p.add_argument("--tiny", action="store_true", help="smoke test: 2 steps, tail 30, seed 0")
    p.add_argument("--out", default=None, help="output folder (default runs/agentic-<UTC time>)")
    p.add_argument(
        "--reuse",
        action="store_true",
        help="read back the finished runs of the same config in --out instead of training them",
    )
    args = p.parse_args(argv)
    tails = [30.0] if args.tiny else [float(x) for x in args.tails.split(",")]
    seeds = [0] if args.tiny else [int(x) for x in args.seeds.split(",")]
    out = Path(args.out or f"runs/agentic-{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}")
    tiny = [*TINY, f'warmstart.cache_dir="{out / "cache"}"']  # its 5-step model stays here
    extra = [*tiny, *args.overrides] if args.tiny else args.overrides
    per_schedule = schedule_sets(args.schedule_set)
    async_tails = [float(x) for x in args.async_tails.split(",") if x]
    rows = []
    sweep = seeds if args.sweep_seeds is None else [int(x) for x in args.sweep_seeds.split(",")]
    for tail in sorted(tails, reverse=True):  # the largest first: the headline runs
        for seed in seeds if tail == max(tails) else sweep:
            for sched in SCHEDULES:
                if sched == "async" and tail not in async_tails and not args.tiny:
                    continue
                name = f"tail{tail:g}-seed{seed}-{sched}"
                print(f"agentic: {name} ...", flush=True)
                res = run_one(
                    out / name,
                    sched,
                    seed,
                    args.median,
                    tail,
                    [*extra, *per_schedule.get(sched, [])],
                    args.reuse,
                )
                rows.append(
                    {
                        "tail": tail,
                        "seed": seed,
                        "schedule": sched,
                        **measures(res, args.target, args.target_gain, args.crossing),
                    }
                )
                with open(out / "rows.jsonl", "a") as f:  # kept if a later run fails
                    f.write(json.dumps(rows[-1]) + "\n")
    print(
        f"| tail p99/median | seed | schedule | time to target (s), training, eval excluded "
        f"({args.crossing} crossing) | wall to target (s) | first crossing (s) | budget, training (s) | budget, wall (s) | final acc | engine busy "
        "| lag mean | ESS tok | turns | ledger |"
    )
    print(
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| --- |"
    )
    for r in rows:
        t, w, first = (
            "-" if r[k] is None else f"{r[k]:.1f}"
            for k in ("time_to_target_s", "time_to_target_wall_s", "time_to_target_first_s")
        )
        print(
            f"| {r['tail']:g} | {r['seed']} | {r['schedule']} | {t} | {w} | {first} "
            f"| {r.get('train_s') or 0:.1f} | {r['wall_s'] or 0:.1f} | {r['final_acc']:.3f} "
            f"| {r['engine_busy'] or 0:.2f} | {r['lag_mean']:.2f} | {r['ess_token']:.3f} "
            f"| {r['turns_mean']:.2f} | {r['ledger_balanced']} |"
        )
    top = max(tails)
    gap = step_gap(rows, "sync", "pipeline", top)
    if gap is not None:
        seeds_txt = ", ".join(f"seed {k} {v * 100:+.1f}" for k, v in gap["by_seed"].items())
        print(
            f"held-out accuracy at the same step, pipeline minus sync (mean over evaluations, "
            f"points): {seeds_txt}; mean {gap['mean'] * 100:+.1f}"
        )
    line = {
        "pipeline_speedup_vs_sync": speedup(rows, "sync", "pipeline", top),
        # JSON has no infinity: an unbounded high end is null
        "pipeline_speedup_vs_sync_bounds": finite_or_none(
            median_bounds(seed_bounds(rows, "sync", "pipeline", top))
        ),
        "pipeline_speedup_by_seed": [
            finite_or_none(list(b)) for b in seed_bounds(rows, "sync", "pipeline", top)
        ],
        "pipeline_speedup_vs_sync_first": speedup(
            rows, "sync", "pipeline", top, "time_to_target_first_s"
        ),
        "crossing": args.crossing,
        # pipeline minus sync held-out accuracy at the same steps (mean over evaluations)
        "pipeline_step_acc_gap": gap,
        "async_speedup_vs_sync": speedup(rows, "sync", "async", top),
        "speedup_by_tail": {f"{t:g}": speedup(rows, "sync", "pipeline", t) for t in tails},
        # the same budget of steps: sync's training time over pipeline's, evaluation excluded
        # (throughput, not learning); the wall clock's ratio beside it
        "pipeline_budget_speedup_vs_sync": speedup(rows, "sync", "pipeline", top, "train_s"),
        "budget_speedup_by_tail": {
            f"{t:g}": speedup(rows, "sync", "pipeline", t, "train_s") for t in tails
        },
        "pipeline_budget_wall_speedup_vs_sync": speedup(rows, "sync", "pipeline", top, "wall_s"),
        "lag_counts": {
            s: _sum_counts(r["lag_counts"] for r in rows if r["schedule"] == s) for s in SCHEDULES
        },
        "engine_busy": by_schedule(rows, "engine_busy", top),
        "engine_busy_by_tail": {f"{t:g}": by_schedule(rows, "engine_busy", t) for t in tails},
        "final_acc": by_schedule(rows, "final_acc", top),
        "final_acc_by_tail": {f"{t:g}": by_schedule(rows, "final_acc", t) for t in tails},
        "ess_token": by_schedule(rows, "ess_token", top),
        "sizes": {
            "median_s": args.median,
            "overrides": extra,
            "schedule_overrides": per_schedule,
            "seeds": seeds,
            "tails": tails,
        },
        "target": args.target if args.target_gain is None else f"start + {args.target_gain}",
        "tiny": args.tiny,
    }
    out.mkdir(parents=True, exist_ok=True)
    # whole or not at all: bench/agentic_plot.py reads it back
    write_atomic(out / "agentic.json", json.dumps({**line, "runs": rows}, indent=2))
    print(json.dumps(line))
    return 0 if all(r["ledger_balanced"] for r in rows) else 1


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _sum_counts(counts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, n in c.items():
            out[k] = out.get(k, 0) + n
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


if __name__ == "__main__":  # the sampler processes are spawned: they import this module
    sys.exit(main(sys.argv[1:]))
