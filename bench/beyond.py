"""What no other framework has: the self-tuning staleness bound, the collapse watchdog, the
forecast of a run's duration (issue 22).

(a) `schedule.max_lag = "auto"` against fixed K in {1, 2, 4, 8}: the `pipeline` schedule on
    the built-in task, the same steps, batch and seeds for all, runs interleaved (seed, then
    configuration) so a change in the machine's load hits every configuration alike.
    Evaluation is deferred (`runtime.defer_eval`, every `--eval-every` steps) so that it takes
    no time from training. Per configuration: time to the target held-out accuracy (fixed
    here, before any run: `--target`) as training time, evaluation excluded (the step
    record's wall clock less the evaluations it holds, observe.clock; beside it the wall
    clock, `time_to_target_wall`; a run that never reaches it counts its whole training time
    and is marked), and final held-out accuracy, medians over seeds.
    `auto_lag_vs_best_fixed`: for time (auto / best fixed, lower is better) and accuracy (auto /
    best fixed, higher is better), the best fixed K picked per metric after the fact, which the
    controller is never told; `time_median_reached` says, for auto and that K, whether the
    median time is a time to target (True) or an unreached run's whole training time (False),
    and `stopped` counts the runs of auto and those K that stopped (collapsed); beside it,
    not part of the target, `time_ratio_monotone`: the same ratio with each run crossing the
    target where its non-decreasing fit does (bench/agentic.py's crossing), so that one
    evaluation's noise above the target is not a crossing; and the two factors of a time to
    target, `step_time_ratio` (training seconds a step over the whole run: what the controller
    sets, measured to a few percent on one set) and `steps_ratio` (steps to target: the seeds'
    learning, as noisy as the time). Target: within 5 % on both (time <= 1.05, accuracy >=
    0.95); `auto_lag_met` is true only where both median times are times to target and no
    compared run stopped.
    Beside it, auto's final accuracy minus that K's seed by seed, with a 90 % bootstrap
    interval of the mean difference (`acc_paired_points`): a best K picked after the fact
    among noisy columns is favoured by its own noise, and the interval says whether a gap
    is larger than the seeds' spread. And `bootstrap` (computed): the seeds resampled, both
    ratios' 90 % intervals, the share of draws meeting both targets and how often each K
    was the fastest, which says how far one set's verdict can be trusted; and
    `null_met_share`, how often a configuration drawn like the fixed Ks would meet both
    targets: the most a controller exactly as good as they are can expect of the verdict.
(b) The watchdog: the same schedule at K = `--wd-lag`, a learning-rate spike injected at
    step `--spike-at` (x `--spike-factor` for `--spike-steps` steps, `watchdog.inject_lr_spike_*`), with the watchdog off, and with
    `rollback` on the `step_kl`, `grad_spike` and `nonfinite` alarms; and an undisturbed run.
    `watchdog_acc_gap`: undisturbed final accuracy minus rollback's, in points (target <= 3).
(c) The forecast: bench/forecast.py (issue 22, part 4) when it exists; its last JSON line's
    `forecast_error_at_25pct` and `forecast_coverage` are passed through. Otherwise null.

Run: python bench/beyond.py [--seeds 0,1,2] [--steps 40] [--lags 1,2,4,8] [--target 0.2 |
     --target-gain 0.06 (each seed's start + 0.06)]
     [--out bench_out/beyond] [--resume] [--skip-auto] [--skip-watchdog] [key=value ...]
The last line is one JSON object: `auto_lag_vs_best_fixed`, `watchdog_acc_gap`,
`forecast_error_at_25pct`, `forecast_coverage`, the sizes and the per-configuration figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slipstream.config.system import ScheduleConfig
from slipstream.files import read_jsonl, write_atomic

if TYPE_CHECKING:
    from slipstream.config import Config

ROLLBACK = [
    "watchdog.enabled=true",
    'watchdog.actions={step_kl="rollback", grad_spike="rollback", nonfinite="rollback"}',
]


def run_config(
    name: str, overrides: list[str], args: argparse.Namespace, extra: list[str]
) -> Config:
    """The config of one `pipeline` run, trained into `args.out`/`name`."""
    from slipstream.config import load_config

    return load_config(
        None,
        [
            f"run.steps={args.steps}",
            f"eval.every={args.eval_every}",
            'schedule.name="pipeline"',
            'runtime.kind="local"',
            "runtime.defer_eval=true",
            "run.quiet=true",
            f"checkpoint.every={args.ckpt_every}",
            *extra,
            *overrides,
            f'run.dir="{Path(args.out) / name}"',
        ],
    )


def run_one(name: str, overrides: list[str], args: argparse.Namespace, extra: list[str]) -> dict:
    """One `pipeline` run; its time to target, final accuracy and K trajectory. With
    `--resume`, a finished run of the same config in its folder is read back instead, never
    one matched by name and seed alone (run.bench.read_back_or_train)."""
    from slipstream.observe.clock import time_to_target, training_total
    from slipstream.observe.runs import with_deferred_heldout
    from slipstream.run.bench import read_back_or_train

    cfg = run_config(name, overrides, args, extra)
    run_dir = Path(str(cfg.run.dir))
    try:
        summary = read_back_or_train(cfg, args.resume, "--resume")
    except RuntimeError as err:  # a collapsed run stops ("N windows ... no informative group")
        rows = read_jsonl(run_dir / "metrics.jsonl")
        return {"acc": None, "acc_start": None, "stopped": f"step {len(rows)}: {err}",
                "time_to_target": None, "time_to_target_wall": None, "reached": False,
                "wall_s": None, "k_path": [], "ess_mean": None, "rollbacks": 0,
                "alarms": []}  # fmt: skip
    rows = read_jsonl(run_dir / "metrics.jsonl")
    # deferred evaluation: the accuracies are in summary.json; the loop is orchestrated
    target = run_target(args, summary["heldout_acc_start"])
    merged = with_deferred_heldout(rows, summary)
    hit = time_to_target(merged, target, False, summary["heldout_acc_start"])
    # beside it, not instead: the crossing of the run's non-decreasing fit (bench/agentic.py's)
    hit_fit = time_to_target(merged, target, False, summary["heldout_acc_start"], monotone=True)
    whole = training_total(summary["wall_s"], rows)
    ks = [r["schedule/max_lag"] for r in rows if "schedule/max_lag" in r]
    ess = [r["staleness/ess_token"] for r in rows if "staleness/ess_token" in r]
    return {
        "acc": summary["heldout_acc_end"],
        "acc_start": summary["heldout_acc_start"],
        # training time, evaluation excluded; never reached: the whole run's
        "time_to_target": whole if hit is None else hit.train_s,
        "time_to_target_monotone": whole if hit_fit is None else hit_fit.train_s,
        "reached_monotone": hit_fit is not None,
        "step_s": whole / summary["steps"],
        "steps_to_target": summary["steps"] if hit is None else hit.step,
        "time_to_target_wall": summary["wall_s"] if hit is None else hit.wall_s,
        "reached": hit is not None,
        "target": target,
        "wall_s": summary["wall_s"],
        "k_path": ks,
        "ess_mean": statistics.fmean(ess) if ess else None,
        "rollbacks": summary.get("watchdog", {}).get("rollbacks", 0),
        "alarms": [
            (e["step"], e["alarm"], e["action"])
            for e in summary.get("watchdog", {}).get("events", [])
        ],
    }


def run_target(args: argparse.Namespace, acc_start: float) -> float:
    """The held-out accuracy a run must reach: `--target`, or with `--target-gain` its own
    start's plus that gain (every configuration of a seed starts from the same warm start, so
    they share it), fixed by rule before any run."""
    return args.target if args.target_gain is None else acc_start + args.target_gain


def part_auto(args: argparse.Namespace, extra: list[str], done: dict) -> dict[str, list[dict]]:
    configs = {f"K={k}": [f"schedule.max_lag={k}"] for k in args.lags}
    auto = ['schedule.max_lag="auto"', f"schedule.max_lag_max={max(args.lags)}"]
    for start in args.auto_starts:  # the default start is "auto"; others `auto@K0`
        configs[auto_name(start)] = [*auto, f"schedule.auto_start={start}"]
    res: dict[str, list[dict]] = {}
    for seed in args.seeds:
        for name, ov in configs.items():
            r = {
                **run_one(
                    f"auto_{name.replace('=', '')}_s{seed}", [*ov, f"run.seed={seed}"], args, extra
                ),
                "seed": seed,
            }
            done[f"{name}/s{seed}"] = r
            res.setdefault(name, []).append(r)
            save(args, done)
            if r["acc"] is None:
                print(f"beyond: {name} seed={seed}: stopped at {r['stopped']}", flush=True)
                continue
            print(
                f"beyond: {name} seed={seed}: acc {r['acc']:.3f}, training time to "
                f"{r.get('target', args.target):.3f} "
                f"{r['time_to_target']:.1f}s{'' if r['reached'] else ' (not reached)'}, "
                f"wall {r['wall_s']:.0f}s, K path {_k_path(r['k_path'])}",
                flush=True,
            )
    return res


DEFAULT_START: int = ScheduleConfig.model_fields["auto_start"].default


def auto_name(start: int) -> str:
    """`auto` for the default start (`schedule.auto_start`), `auto@K0` for a diagnostic run
    started at another K0."""
    return "auto" if start == DEFAULT_START else f"auto@{start}"


def _k_path(ks: list[int]) -> str:
    """`1x3 2x5 ...`: each K and for how many steps, in order."""
    out: list[list[int]] = []
    for k in ks:
        if out and out[-1][0] == k:
            out[-1][1] += 1
        else:
            out.append([k, 1])
    return " ".join(f"{k}x{n}" for k, n in out) or "-"


def part_watchdog(args: argparse.Namespace, extra: list[str], done: dict) -> dict[str, dict]:
    base = [f"schedule.max_lag={args.wd_lag}", f"run.seed={args.wd_seed}"]
    spike = [
        f"watchdog.inject_lr_spike_at={args.spike_at}",
        f"watchdog.inject_lr_spike_factor={args.spike_factor}",
        f"watchdog.inject_lr_spike_steps={args.spike_steps}",
    ]
    configs = {
        "undisturbed": base,
        "spike, no watchdog": [*base, *spike],
        "spike, rollback": [*base, *spike, *ROLLBACK],
    }
    res = {}
    for i, (name, ov) in enumerate(configs.items()):
        r = run_one(f"wd_{i}", ov, args, extra)
        done[f"wd/{name}"] = res[name] = r
        if r["acc"] is None:
            print(f"beyond: watchdog {name}: the run stopped at {r['stopped']}", flush=True)
        else:
            print(
                f"beyond: watchdog {name}: acc {r['acc']:.3f} (start {r['acc_start']:.3f}), "
                f"rollbacks {r['rollbacks']}, alarms {r['alarms'][:6]}",
                flush=True,
            )
        save(args, done)
    return res


def save(args: argparse.Namespace, done: dict) -> None:
    write_atomic(Path(args.out) / "results.json", json.dumps(done, indent=1))


def auto_table(res: dict[str, list[dict]], target: float | str) -> tuple[str, dict[str, Any]]:
    """The (a) table and `auto_lag_vs_best_fixed`. A run that stopped (collapsed: no time,
    no accuracy) is left out of the medians and counted in the `reached` column."""
    lines = [
        f"| K | time to {target} (s, training, eval excluded): median (range) | reached "
        "| final acc: median (range) | ESS token |",
        "| --- | --- | --- | --- | --- |",
    ]
    done = {n: [r for r in runs if r["acc"] is not None] for n, runs in res.items()}
    for name, runs in res.items():
        ok, stopped = done[name], len(runs) - len(done[name])
        reached = f"{sum(r['reached'] for r in ok)}/{len(runs)}" + (
            f", {stopped} stopped" if stopped else ""
        )
        if not ok:
            lines.append(f"| {name} | - | {reached} | - | - |")
            continue
        t, a = [r["time_to_target"] for r in ok], [r["acc"] for r in ok]
        e = [r["ess_mean"] for r in ok if r["ess_mean"] is not None]
        lines.append(
            f"| {name} | {statistics.median(t):.1f} ({min(t):.1f}-{max(t):.1f}) | {reached} "
            f"| {statistics.median(a):.3f} ({min(a):.3f}-{max(a):.3f}) "
            f"| {statistics.fmean(e) if e else float('nan'):.3f} |"
        )
    med_t, med_a = column_medians(done, "time_to_target"), column_medians(done, "acc")
    fixed = [n for n in med_t if n.startswith("K=")]
    if "auto" not in med_t or not fixed:
        return "\n".join(lines), {"time_ratio": None, "acc_ratio": None}
    best_t = min(fixed, key=lambda n: med_t[n])
    best_a = max(fixed, key=lambda n: med_a[n])
    lines.append(
        f"\nauto against {best_a} seed by seed (points of final accuracy, auto minus K): "
        + _paired_text(paired(res, best_a))
    )
    ratio = {
        "time_ratio": med_t["auto"] / med_t[best_t],
        "acc_ratio": med_a["auto"] / med_a[best_a] if med_a[best_a] > 0 else float("nan"),
        "best_fixed_time": best_t,
        "best_fixed_acc": best_a,
        # False: that median time is a run's whole training time (it never reached the target), so
        # time_ratio compares budgets there, not times to target
        "time_median_reached": {n: median_reached(done[n]) for n in ("auto", best_t)},
        # runs that stopped (collapsed), left out of these medians
        "stopped": {n: len(res[n]) - len(done[n]) for n in ("auto", best_t, best_a)},
        "acc_paired_points": paired(res, best_a),
    }
    ratio["bootstrap"] = ratio_bootstrap(res)
    lines.append(_bootstrap_text(ratio["bootstrap"]))
    for key, (run_key, what) in BESIDE.items():  # beside the target, not part of it
        ratio[key] = fastest_ratio(done, run_key)
        if ratio[key] is not None:
            lines.append(f"beside: {what}, auto's median over the smallest K's: {ratio[key]:.3f}")
    for name in sorted(n for n in med_t if n.startswith("auto@")):  # diagnostic starts
        ratio[f"{name}_time_ratio"] = med_t[name] / med_t[best_t]
        ratio[f"{name}_acc_ratio"] = med_a[name] / med_a[best_a] if med_a[best_a] else None
    return "\n".join(lines), ratio


def column_medians(done: dict[str, list[dict]], key: str) -> dict[str, float]:
    """Each configuration's median of its finished runs' `key`; configurations with none left
    out."""
    return {n: statistics.median(r[key] for r in rows) for n, rows in done.items() if rows}


# Ratios reported beside the target, not part of it: each is auto's median of a run's key
# over the smallest fixed K's median, and what it says. Time to target = steps to it x seconds
# a step: the controller sets the seconds, the seeds' learning the steps.
BESIDE = {
    "time_ratio_monotone": (
        "time_to_target_monotone",
        "time to target at the crossing of each run's non-decreasing fit (observe.clock)",
    ),
    "step_time_ratio": ("step_s", "training seconds a step over the whole run"),
    "steps_ratio": ("steps_to_target", "steps to target (a run's budget where never reached)"),
}


def fastest_ratio(done: dict[str, list[dict]], key: str) -> float | None:
    """auto's median `key` over the smallest fixed K's median (lower is better for each key
    it is used with); None where a run lacks it (read back from an older results.json) or no
    K or auto finished."""
    runs = [r for rows in done.values() for r in rows]
    if not runs or any(key not in r for r in runs):
        return None
    med = column_medians(done, key)
    fixed = [med[n] for n in med if n.startswith("K=")]
    return med["auto"] / min(fixed) if "auto" in med and fixed else None


def auto_lag_met(ratio: dict[str, Any]) -> bool:
    """Whether auto met its target, within 5 % of the best fixed K on both time (ratio <= 1.05)
    and accuracy (ratio >= 0.95), on medians that are what they say: each compared median time
    a time to target (`time_median_reached`: not an unreached run's whole training time) and no
    compared configuration with a stopped run (left out of its medians)."""
    t, a = ratio.get("time_ratio"), ratio.get("acc_ratio")
    reached, stopped = ratio.get("time_median_reached", {}), ratio.get("stopped", {})
    if t is None or a is None or not reached or not all(reached.values()):
        return False
    return within_targets(t, a) and not any(stopped.values())


def within_targets(time_ratio: float, acc_ratio: float) -> bool:
    """Issue 22's test on auto / best fixed K: time within 5 % (lower is better) and accuracy
    within 5 % (higher is better); a NaN ratio fails."""
    return time_ratio <= 1.05 and acc_ratio >= 0.95


def finished_by_seed(rows: list[dict]) -> dict[int, dict]:
    """A configuration's runs that finished (a final accuracy), by seed."""
    return {r["seed"]: r for r in rows if r.get("acc") is not None and "seed" in r}


def paired(
    res: dict[str, list[dict]], fixed: str, reps: int = 2000, other: str = "auto"
) -> dict[str, Any]:
    """`other`'s final accuracy minus `fixed`'s on each seed both finished, in points, their
    mean and a 90 % bootstrap interval of that mean over seeds (resampled with a fixed seed):
    does the gap stand out of the seeds' noise?"""
    import random

    base = finished_by_seed(res[fixed])
    diffs = [
        round(100 * (r["acc"] - base[seed]["acc"]), 2)
        for seed, r in finished_by_seed(res[other]).items()
        if seed in base
    ]
    if not diffs:
        return {"diffs": [], "mean": None, "interval90": None}
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(reps))
    lo, hi = means[int(0.05 * reps)], means[int(0.95 * reps) - 1]
    return {"diffs": diffs, "mean": statistics.fmean(diffs), "interval90": [lo, hi]}


def ratio_bootstrap(res: dict[str, list[dict]], reps: int = 2000) -> dict[str, Any]:
    """How far one set's verdict can be trusted (computed from its runs, not measured): the
    seeds resampled with replacement (a fixed seed), the same draw for every configuration
    (a seed's runs share a warm start and a target), and on each draw the two ratios of
    `auto_table` again, the best fixed K picked again after the fact. Gives the 90 %
    intervals of both ratios, the share of draws on which auto meets both 5 % targets, and
    how often each K was the fastest: a best K that changes from draw to draw is not
    identified by the set. Only seeds on which every compared configuration finished."""
    import random

    names = [n for n in res if n.startswith("K=")]
    if "auto" not in res or not names:
        return {"seeds": 0}
    by = {n: finished_by_seed(res[n]) for n in [*names, "auto"]}
    seeds = sorted(set.intersection(*(set(v) for v in by.values())))
    if len(seeds) < 2:
        return {"seeds": len(seeds)}
    rng = random.Random(0)
    times, accs, met = [], [], 0
    fastest = dict.fromkeys(names, 0)
    for _ in range(reps):
        draw = rng.choices(seeds, k=len(seeds))
        t = {n: statistics.median(by[n][s]["time_to_target"] for s in draw) for n in by}
        a = {n: statistics.median(by[n][s]["acc"] for s in draw) for n in by}
        best = min(names, key=lambda n: t[n])
        fastest[best] += 1
        times.append(t["auto"] / t[best])
        best_a = max(a[n] for n in names)
        accs.append(a["auto"] / best_a if best_a > 0 else float("nan"))
        met += within_targets(times[-1], accs[-1])
    times.sort()
    accs.sort()
    lo, hi = int(0.05 * reps), int(0.95 * reps) - 1
    return {
        "seeds": len(seeds),
        "time_ratio_interval90": [times[lo], times[hi]],
        "acc_ratio_interval90": [accs[lo], accs[hi]],
        "met_share": met / reps,
        "fastest_share": {n: c / reps for n, c in fastest.items()},
        "null_met_share": null_met_share([by[n][s] for n in names for s in seeds], len(seeds)),
    }


def null_met_share(pool: list[dict], n: int, columns: int = 4, reps: int = 2000) -> float:
    """The set's power (computed, nothing run): the share of draws on which a configuration
    no different from the fixed Ks would meet both 5 % targets. Each draw gives it and each of
    `columns` fixed Ks `n` runs drawn with replacement from `pool` (the fixed-K runs that
    finished, a run's time and accuracy kept together, seeds not paired), then the two
    ratios as `auto_table` takes them, the best K picked after the fact. Where the Ks differ,
    the pool mixes them, so this is the chance for a controller as good as a K taken at
    random; where they do not, the chance for one exactly as good as the best. Well below 1:
    the 5 % target on medians of `n` seeds fails a controller that matches the fixed Ks that
    often, as the best of several noisy medians is favoured by its own noise."""
    import random

    rng = random.Random(0)
    met = 0
    for _ in range(reps):
        cols = [rng.choices(pool, k=n) for _ in range(columns + 1)]
        t = [statistics.median(r["time_to_target"] for r in c) for c in cols]
        a = [statistics.median(r["acc"] for r in c) for c in cols]
        fastest, best_a = min(t[1:]), max(a[1:])  # 0 s: the target was held from the start
        time_ratio = t[0] / fastest if fastest > 0 else (1.0 if t[0] <= 0 else float("inf"))
        met += within_targets(time_ratio, a[0] / best_a if best_a > 0 else 1.0)
    return met / reps


def _bootstrap_text(b: dict[str, Any]) -> str:
    if "met_share" not in b:
        return f"bootstrap over seeds: {b['seeds']} seed(s) in common, too few"
    (tl, th), (al, ah) = b["time_ratio_interval90"], b["acc_ratio_interval90"]
    fastest = ", ".join(f"{n} {s:.0%}" for n, s in b["fastest_share"].items())
    return (
        f"bootstrap over the {b['seeds']} seeds (computed): time ratio 90 % {tl:.2f}-{th:.2f}, "
        f"accuracy ratio {al:.3f}-{ah:.3f}; both within 5 % on {b['met_share']:.0%} of draws; "
        f"fastest fixed K: {fastest}; a configuration drawn like the fixed Ks would meet both "
        f"on {b['null_met_share']:.0%} of draws (the set's power)"
    )


def _paired_text(p: dict[str, Any]) -> str:
    if p["mean"] is None:
        return "no seed in common"
    lo, hi = p["interval90"]
    return f"mean {p['mean']:+.1f} (90 % bootstrap {lo:+.1f} to {hi:+.1f}), per seed {p['diffs']}"


def median_reached(runs: list[dict]) -> bool:
    """Whether the run(s) at the median of `time_to_target` reached the target (True) or
    stand there with their whole training time (False; with an even count, either middle one)."""
    ranked = sorted(runs, key=lambda r: r["time_to_target"])
    n = len(ranked)
    middle = ranked[(n - 1) // 2 : n // 2 + 1]
    return all(r["reached"] for r in middle)


def forecast(args: argparse.Namespace) -> dict[str, Any]:
    """bench/forecast.py's figures, when that script exists (another part of issue 22)."""
    script = Path(__file__).with_name("forecast.py")
    if not script.exists() or args.skip_forecast:
        why = "skipped (--skip-forecast)" if args.skip_forecast else "bench/forecast.py not present"
        print(f"beyond: forecast {why}: forecast keys are null")
        return {"forecast_error_at_25pct": None, "forecast_coverage": None}
    out = subprocess.run(
        [sys.executable, str(script), *args.forecast_args.split()],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(out)
    last = json.loads(out.splitlines()[-1])
    return {k: last.get(k) for k in ("forecast_error_at_25pct", "forecast_coverage")}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--lags", default="1,2,4,8")
    ap.add_argument(
        "--auto-starts",
        default=str(DEFAULT_START),
        help=f"auto's first K, one configuration each: {DEFAULT_START} (the default) is `auto`; "
        "others (`auto@2`) are diagnostics, reported beside it",
    )
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.2)
    ap.add_argument(
        "--target-gain",
        type=float,
        default=None,
        help="instead of --target: each run's target is its start's held-out accuracy + this",
    )
    ap.add_argument("--wd-lag", type=int, default=2)
    ap.add_argument("--wd-seed", type=int, default=0)
    ap.add_argument("--spike-at", type=int, default=20)
    ap.add_argument("--spike-factor", type=float, default=30.0)
    ap.add_argument("--spike-steps", type=int, default=2)
    ap.add_argument("--out", default="bench_out/beyond")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="read back the finished runs of the same config in OUT instead of training them; "
        "an unfinished one of the same settings is trained again, one of other settings refused",
    )
    ap.add_argument("--skip-auto", action="store_true")
    ap.add_argument("--skip-watchdog", action="store_true")
    ap.add_argument("--skip-forecast", action="store_true")
    ap.add_argument("--forecast-args", default="", help="passed to bench/forecast.py")
    args, extra = ap.parse_known_args(argv)
    args.seeds = [int(x) for x in args.seeds.split(",")]
    args.lags = [int(x) for x in args.lags.split(",")]
    args.auto_starts = [int(x) for x in args.auto_starts.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done: dict[str, Any] = {}  # this call's runs, trained or read back: OUT/results.json
    result: dict[str, Any] = {
        "steps": args.steps,
        "seeds": args.seeds,
        "target": args.target if args.target_gain is None else f"start + {args.target_gain}",
    }
    if not args.skip_auto:
        res = part_auto(args, extra, done)
        text, ratio = auto_table(res, result["target"])
        print(text)
        result["auto_lag_vs_best_fixed"] = ratio
        result["auto_lag_met"] = auto_lag_met(ratio)
    if not args.skip_watchdog:
        wd = part_watchdog(args, extra, done)
        print("| run | final acc | rollbacks |\n| --- | --- | --- |")
        for name, r in wd.items():
            acc = "stopped (collapse)" if r["acc"] is None else f"{r['acc']:.3f}"
            print(f"| {name} | {acc} | {r['rollbacks']} |")

        def gap_to(name: str) -> float | None:  # points below the undisturbed run
            a, b = wd["undisturbed"]["acc"], wd[name]["acc"]
            return None if a is None or b is None else 100 * (a - b)

        gap = gap_to("spike, rollback")
        result["watchdog_acc_gap"] = gap
        result["watchdog_no_rollback_gap"] = gap_to("spike, no watchdog")
        result["watchdog_no_rollback_stopped"] = wd["spike, no watchdog"].get("stopped")
        result["watchdog_met"] = gap is not None and gap <= 3.0
    result.update(forecast(args))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":  # the sampler processes are spawned: they import this module
    sys.exit(main(sys.argv[1:]))
