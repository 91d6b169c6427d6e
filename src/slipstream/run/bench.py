"""`slipstream bench schedules`: the schedules on one task, against the best synchronous one.

Each configuration trains `run.steps` versions from the same warm start with the same config
(the defaults of `slipstream train`, plus any `key=value` given), for every seed of `--seeds`
(default 0,1,2), interleaved: seed 0 of every configuration, then seed 1, ..., so that a slow
stretch of a shared machine falls on all of them alike. The configurations are the presets on
the local runtime (one trainer process, `runtime.num_samplers` sampler processes) and
`sync_inprocess`: the synchronous loop in one process with every core, what `slipstream train`
runs by default. The baseline is the better of the two synchronous configurations (`sync_inprocess`
and `sync` on the local runtime): the one that reached the target on more seeds, on a tie the
lower censored median time to target (a run that never reached it at its budget); both are
reported.

Timing: runs of the local runtime measure held-out accuracy on weight snapshots after the run
(`runtime.defer_eval`), so evaluation takes from them only the snapshot's write; the in-process
loop evaluates inline. Every configuration is timed on one clock, its training time,
evaluation excluded (observe.clock): the wall clock of its step records less the seconds of
the evaluations each holds (`time/eval_s`, `time/eval_start_s`; the in-process loop times a
record after its step's evaluation, the orchestrated loops before it). Time to target is that
clock at the first evaluated step whose accuracy reaches the target (`time_to_target_s`;
beside it the wall clock there, evaluations included, `time_to_target_wall_s`); `train_s` is
the whole budget on it (`run.steps` for all; `wall_s` the same on the wall clock).

The target is fixed before any training and does not come from the compared runs: `--target`
(one accuracy for every run) if given, else, per seed, the held-out accuracy of that seed's
warm start (the start of its runs: warm starts differ by seed) plus `--target-gain` (default
0.10). An absolute target below a seed's start is reached at time 0 by every configuration,
which says nothing: prefer the gain.

Per seed, the pipeline's time-to-target ratio (baseline / pipeline: above 1, the pipeline gets
there sooner) and wall ratio (pipeline / baseline, the same steps); medians and ranges over
the seeds. A run that never reached the target is censored at its budget (observe.censored):
its seed's ratio is known within bounds (baseline unreached: at least its budget over the
pipeline's time; pipeline unreached: at most the baseline's time over its budget), never left
out, and the median's bounds are reported with the number of seeds; the median itself is None
where they differ. Prints a table, saves it (`bench_schedules.md`, `bench_schedules.json` in
`--out`), and ends with one JSON line: `{"presets": {NAME: {"time_to_target_s",
"time_to_target_range", "time_to_target_wall_s", "time_to_target_censored_s", "final_acc",
"train_s", "wall_s", "sampler_busy", "trainer_wait", "lag_mean", "lag_max", "ess", "reached"}},
"baseline", "target", "seeds", "pipeline_speedup_vs_sync", "pipeline_speedup_vs_sync_bounds",
"pipeline_speedup_vs_sync_range", "pipeline_wall_ratio", "pipeline_wall_ratio_range",
"pipeline_speedup_vs": {SYNC: {"speedup", "speedup_bounds", "speedup_range",
"speedup_by_seed", "speedup_seeds", "speedup_reached", "wall_ratio", "wall_ratio_range"}}}`,
where `time_to_target_s` (over the seeds that reached it) and the ratios are training time,
evaluation excluded (the wall ratio is of `train_s`), `time_to_target_wall_s`, `wall_s` the
wall clock, and an unbounded end of bounds or a range is null.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import shutil
import statistics
from pathlib import Path
from typing import Any

from slipstream.argv import OneLineParser
from slipstream.config import Config, ConfigError, load_config
from slipstream.observe.censored import finite_or_none, median_bounds, point, ratio_bounds
from slipstream.observe.clock import EVAL_S, EVAL_START_S, Reached, time_to_target, training_total
from slipstream.observe.runs import finished_summary, saved_changes, with_deferred_heldout
from slipstream.run.preflight import held_run
from slipstream.schedule.presets import PRESETS

INPROCESS = "sync_inprocess"
CONFIGS = (INPROCESS, *PRESETS)
SYNCS = (INPROCESS, "sync")
COLUMNS = (
    "time_to_target_s",
    "time_to_target_range",
    "time_to_target_wall_s",
    "time_to_target_censored_s",
    "final_acc",
    "train_s",
    "wall_s",
    "sampler_busy",
    "trainer_wait",
    "lag_mean",
    "lag_max",
    "ess",
    "reached",
)


def first_reach(run: dict[str, Any], target: float) -> Reached | None:
    """Where a run's summary (with its `clock_view`) first reached `target` (None: never)."""
    return time_to_target(run["clock"], target, run["eval_in_wall"], run["heldout_acc_start"])


def bench_config(name: str, out: Path, overrides: list[str], eval_every: int, seed: int) -> Config:
    """The config of one configuration with one seed, trained into `out`."""
    fixed = [f"run.dir={json.dumps(str(out))}", f"run.seed={seed}", "run.quiet=true"]
    if name == INPROCESS:
        own = ['schedule.name="sync"', 'runtime.kind="inprocess"']
    else:
        own = [f'schedule.name="{name}"', 'runtime.kind="local"', "runtime.defer_eval=true"]
    return load_config(None, [f"eval.every={eval_every}", *overrides, *fixed, *own])


def run_config(name: str, cfg: Config) -> dict[str, Any]:
    """Train configuration `name` (`bench_config`); its summary with its `clock_view`."""
    from slipstream.run.launch import train_async
    from slipstream.run.sync import train_sync

    summary = train_sync(cfg) if name == INPROCESS else train_async(cfg)
    return {**summary, **clock_view(name, Path(str(cfg.run.dir)), summary)}


CLOCK_KEYS = ("step", "wall_s", EVAL_S, EVAL_START_S, "heldout_acc")


def clock_view(name: str, run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """What the bench reads of a run besides its summary: its step records on the clock of
    the module doc (`clock`: the keys of `CLOCK_KEYS`, deferred accuracies merged in), which
    loop's ordering they follow (`eval_in_wall`), the budget's training time (`train_s`), and
    for the in-process loop the utilisation columns (it has no lag: K = 0)."""
    from slipstream.run.summary import read_records

    rows = with_deferred_heldout(read_records(run_dir / "metrics.jsonl"), summary)
    view: dict[str, Any] = {
        "clock": [{k: r[k] for k in CLOCK_KEYS if k in r} for r in rows],
        "eval_in_wall": name == INPROCESS,
        "train_s": training_total(float(summary["wall_s"]), rows),
    }
    if name != INPROCESS:
        return view
    steps = sum(float(r["step_time_s"]) for r in rows)
    busy = sum(float(r["time/generate_s"]) for r in rows) / steps if steps else 0.0
    # the trainer waits while it generates
    return view | {
        "sampler_busy": busy,
        "trainer_wait": busy,
        "lag_mean": 0.0,
        "lag_max": 0,
        "ess_token": 1.0,
    }


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _range(xs: list[float]) -> list[float] | None:
    return [min(xs), max(xs)] if xs else None


def _span(r: list[float | None] | None) -> str:
    """A range as printed: `1.18-2.16`, `0.00-inf` (None: unbounded), `1.18` (one value), or
    `none`."""
    return "none" if not r else "-".join("inf" if x is None else f"{x:.2f}" for x in r)


def aggregate(per_seed: list[dict[str, Any]], targets: list[float]) -> dict[str, Any]:
    """Per configuration over seeds: medians (time to target over the seeds that reached it,
    with their range and count) of every column, and the censored median time to target
    (`time_to_target_censored_s`: over every seed, a run that never reached the target at its
    budget, which it would have needed more than: a lower bound where one did not reach).
    `targets[i]`: seed i's target."""
    out: dict[str, Any] = {}
    for name in per_seed[0]:
        pairs = [(s[name], t) for s, t in zip(per_seed, targets, strict=True) if name in s]
        runs = [r for r, _ in pairs]
        reach = [first_reach(r, t) for r, t in pairs]
        hits = [x for x in reach if x is not None]
        ttt = [x.train_s for x in hits]
        censored = [
            float(r["train_s"]) if x is None else x.train_s
            for r, x in zip(runs, reach, strict=True)
        ]
        med = {
            k: statistics.median(float(r[src]) for r in runs)
            for k, src in (
                ("final_acc", "heldout_acc_end"),
                ("train_s", "train_s"),
                ("wall_s", "wall_s"),
                ("sampler_busy", "sampler_busy"),
                ("trainer_wait", "trainer_wait"),
                ("lag_mean", "lag_mean"),
                ("lag_max", "lag_max"),
                ("ess", "ess_token"),
            )
        }
        reached = f"{len(ttt)}/{len(runs)}"
        out[name] = {
            "time_to_target_s": _median(ttt),
            "time_to_target_range": _range(ttt),
            "time_to_target_wall_s": _median([x.wall_s for x in hits]),
            "time_to_target_censored_s": _median(censored),
            **med,
            "reached": reached,
            "reached_seeds": len(ttt),
        }
    return out


def ratios(per_seed: list[dict[str, Any]], base: str, targets: list[float]) -> dict[str, Any]:
    """Per seed: base time to target / pipeline's, pipeline budget / base budget (training
    time, evaluation excluded, both). A run that never reached the target is censored at its
    budget (observe.censored): its seed's speedup is known within bounds, never dropped. The
    median speedup's bounds (an unbounded end None), the median itself where they meet (else
    None), each seed's bounds, their range, and how many seeds were compared and how many
    both runs reached; the wall ratio's median and range."""
    bounds, wall, both = [], [], 0
    for s, target in zip(per_seed, targets, strict=True):
        if base not in s or "pipeline" not in s:
            continue
        a, b = first_reach(s[base], target), first_reach(s["pipeline"], target)
        both += a is not None and b is not None
        bounds.append(
            ratio_bounds(
                None if a is None else a.train_s, s[base]["train_s"],
                None if b is None else b.train_s, s["pipeline"]["train_s"],
            )
        )  # fmt: skip
        wall.append(s["pipeline"]["train_s"] / s[base]["train_s"])
    med = median_bounds(bounds)
    return {
        "speedup": point(med),
        "speedup_bounds": finite_or_none(med),
        "speedup_range": finite_or_none(
            [min(lo for lo, _ in bounds), max(hi for _, hi in bounds)] if bounds else None
        ),
        "speedup_by_seed": [finite_or_none(b) for b in bounds],
        "speedup_seeds": len(bounds),
        "speedup_reached": both,
        "wall_ratio": _median(wall),
        "wall_ratio_range": _range(wall),
    }


def baseline(agg: dict[str, Any]) -> str | None:
    """The synchronous configuration that reached the target on the most seeds, of those the
    one with the lower censored median time to target (`time_to_target_censored_s`), the
    lower median budget on a tie: a median over the seeds that reached alone would let a
    configuration that reached once beat one that always did."""
    syncs = [n for n in SYNCS if n in agg]
    if not syncs:
        return None

    def key(n: str) -> tuple[int, float, float]:
        t = agg[n]["time_to_target_censored_s"]
        return (-agg[n]["reached_seeds"], float("inf") if t is None else t, agg[n]["train_s"])

    return min(syncs, key=key)


def _fmt(x: float | None, f: str) -> str:
    return "never" if x is None else format(x, f)


def table(agg: dict[str, Any], targets: list[float], seeds: list[int]) -> str:
    shown = ", ".join(f"{t:.3f}" for t in targets)
    lines = [
        f"target held-out accuracy by seed {shown}; medians over seeds {seeds} (range); "
        "training time, evaluation excluded, and beside it the wall clock",
        "",
        "| config | time to target (s) | wall to target (s) | reached | final acc | train (s) "
        "| wall (s) | sampler busy | trainer wait | lag mean | lag max | ESS token |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in agg.items():
        rng = r["time_to_target_range"]
        ttt = _fmt(r["time_to_target_s"], ".1f")
        if rng:
            ttt += f" ({rng[0]:.1f}-{rng[1]:.1f})"
        lines.append(
            f"| {name} | {ttt} | {_fmt(r['time_to_target_wall_s'], '.1f')} | {r['reached']} "
            f"| {r['final_acc']:.3f} | {r['train_s']:.1f} | {r['wall_s']:.1f} "
            f"| {100 * r['sampler_busy']:.0f}% | {100 * r['trainer_wait']:.0f}% "
            f"| {r['lag_mean']:.2f} | {r['lag_max']:.0f} | {r['ess']:.3f} |"
        )
    return "\n".join(lines)


def _parser() -> OneLineParser:
    p = OneLineParser(
        prog="slipstream bench schedules", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("overrides", nargs="*", help="key=value config overrides, applied to every run")
    p.add_argument(
        "--presets", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}"
    )
    p.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds (interleaved)")
    p.add_argument("--target", type=float, default=None, help="held-out accuracy to reach")
    p.add_argument(
        "--target-gain",
        type=float,
        default=0.10,
        help="default target: the warm start's held-out accuracy + this",
    )
    p.add_argument("--eval-every", type=int, default=5, help="evaluate every N steps")
    p.add_argument("--out", default=None, help="output folder (default runs/bench-<UTC time>)")
    p.add_argument(
        "--reuse",
        action="store_true",
        help="read back a finished run of the same settings in its folder instead of training "
        "it, and train an unfinished one of the same settings again (finish an interrupted "
        "bench)",
    )
    return p


def reuse(name: str, cfg: Config) -> dict[str, Any] | None:
    """The summary, with its `clock_view`, of a finished run of exactly `cfg` in its folder
    (observe.runs.finished_summary); None if there is none."""
    summary = finished_summary(cfg)
    if summary is None:
        return None
    return {**summary, **clock_view(name, Path(str(cfg.run.dir)), summary)}


def check_folder(cfg: Config, reuse: bool, flag: str = "--reuse") -> bool:
    """Before any run trains: whether `cfg`'s folder holds a run that must be trained again
    (with `reuse`: an unfinished run of the same settings, which `bench_schedules_main`
    removes). A run there that would be mixed with the new one, or removed though it is not
    this bench's, is a `ConfigError`: any run without `reuse`; with it, a run of other
    settings, finished or not, or one without a config.toml. `flag`: the option that sets
    `reuse`, as the error names it (bench/beyond.py and bench/staleness.py call it --resume)."""
    folder = Path(str(cfg.run.dir))
    held = held_run(folder)
    if held is None or (reuse and finished_summary(cfg) is not None):
        return False
    if not reuse:
        raise ConfigError(
            f"bench: {folder} already holds a run ({held}); pass {flag} to read back finished "
            "runs of the same settings, or give another --out"
        )
    changed = saved_changes(folder, cfg)
    if changed == []:  # the same settings, not finished (no summary.json, or an unreadable one)
        return True
    finished = (folder / "summary.json").is_file()
    raise ConfigError(
        f"bench: {flag}: {folder} holds {'a finished' if finished else 'an unfinished'} run "
        f"of other settings ({', '.join((changed or ['no config.toml'])[:5])}); "
        "give another --out"
    )


def read_back_or_train(cfg: Config, reuse: bool, flag: str = "--reuse") -> dict[str, Any]:
    """For bench scripts of the orchestrated loop: the summary of a finished run of exactly
    `cfg` in its folder, read back with `reuse` (`finished_summary`: never a run matched by
    its folder's name alone), else of `cfg` trained (`run.launch.train_async`), an unfinished
    run of the same settings there removed first and any other run refused (`check_folder`,
    `flag` as its error names the option). A run that stops raises as `train_async` does."""
    from slipstream.run.launch import train_async

    summary = finished_summary(cfg) if reuse else None
    if summary is not None:
        print(f"bench: {cfg.run.dir}: a finished run of the same settings, read back", flush=True)
        return summary
    if check_folder(cfg, reuse, flag):  # an interrupted run: trained again from the start
        shutil.rmtree(str(cfg.run.dir))
    return train_async(cfg)


def _check_numbers(args: argparse.Namespace, parser: OneLineParser) -> None:
    """`--eval-every`, `--target` and `--target-gain`, checked before any run trains: a NaN or
    an infinite target is never reached, so every configuration would train its whole budget
    to end "never"; a gain (what sets the target without `--target`) of 0 or below puts the
    target at or under the warm start's accuracy, which every configuration reaches at time 0
    (module doc); an evaluation interval below 1 was refused by the config, naming eval.every,
    which is no flag here."""
    if args.eval_every < 1:
        parser.error(f"--eval-every must be >= 1, got {args.eval_every}")
    if args.target is not None and not math.isfinite(args.target):
        parser.error(f"--target must be a finite held-out accuracy, got {args.target}")
    if args.target is None and not (math.isfinite(args.target_gain) and args.target_gain > 0):
        parser.error(f"--target-gain must be a finite number > 0, got {args.target_gain}")


def _ints(text: str, parser: argparse.ArgumentParser) -> list[int]:
    """`--seeds`: distinct integers, comma-separated, at least one; else `parser.error`."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {text!r}")
    if not seeds or len(set(seeds)) != len(seeds):
        parser.error(f"--seeds: expected distinct comma-separated integers, got {text!r}")
    return seeds


def bench_schedules_main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.presets.split(",") if n.strip()]
    for n in names:
        if n not in CONFIGS:
            parser.error(f"unknown preset {n!r}; valid: {', '.join(CONFIGS)}")
    if not names or len(set(names)) != len(names):
        parser.error(f"--presets: expected distinct presets, got {args.presets!r}")
    seeds = _ints(args.seeds, parser)
    _check_numbers(args, parser)
    out = Path(args.out or f"runs/bench-{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}")
    cfgs = {
        (seed, n): bench_config(
            n, out / f"seed{seed}" / n if len(seeds) > 1 else out / n,
            args.overrides, args.eval_every, seed,
        )
        for seed in seeds
        for n in names
    }  # fmt: skip
    again = [k for k, cfg in cfgs.items() if check_folder(cfg, args.reuse)]
    out.mkdir(parents=True, exist_ok=True)
    per_seed: list[dict[str, Any]] = []
    for seed in seeds:
        per_seed.append({})
        for n in names:
            print(f"bench: {n} seed {seed} ...", flush=True)
            cfg = cfgs[seed, n]
            if (seed, n) in again:  # an interrupted run: trained again from the start
                print(f"bench: {cfg.run.dir} holds an unfinished run: training it again")
                shutil.rmtree(str(cfg.run.dir))
            s = (reuse(n, cfg) if args.reuse else None) or run_config(n, cfg)
            per_seed[-1][n] = s
            acc = f"{s['heldout_acc_start']:.3f} -> {s['heldout_acc_end']:.3f}"
            print(f"bench: {n} seed {seed}: {s['wall_s']:.0f}s, held-out {acc}", flush=True)
    starts = [s[names[0]]["heldout_acc_start"] for s in per_seed]
    targets = [args.target if args.target is not None else a + args.target_gain for a in starts]
    report(per_seed, seeds, targets, out)
    return 0


def report(
    per_seed: list[dict[str, Any]], seeds: list[int], targets: list[float], out: Path
) -> None:
    """Print and save the table and the JSON line of the module doc."""
    agg = aggregate(per_seed, targets)
    base = baseline(agg)
    vs = {b: ratios(per_seed, b, targets) for b in SYNCS if b in agg and "pipeline" in agg}
    best = vs.get(base or "", {})
    text = table(agg, targets, seeds)
    if best:
        text += (
            f"\n\npipeline vs {base} (the better sync), training time: time to target "
            f"{'undecided' if best['speedup'] is None else 'x' + format(best['speedup'], '.2f')} "
            f"(median within {_span(best['speedup_bounds'])}, {best['speedup_seeds']} seeds, "
            f"{best['speedup_reached']} reached by both; per seed "
            f"{', '.join(_span(b[:1] if b[0] == b[1] else b) for b in best['speedup_by_seed'])}), "
            f"wall ratio {_fmt(best['wall_ratio'], '.2f')} (range {_span(best['wall_ratio_range'])})"
        )
    print(text)
    (out / "bench_schedules.md").write_text(text + "\n")
    line = {
        "presets": {n: {k: r[k] for k in COLUMNS} for n, r in agg.items()},
        "baseline": base,
        "target": targets,
        "seeds": seeds,
        "pipeline_speedup_vs_sync": best.get("speedup"),
        "pipeline_speedup_vs_sync_bounds": best.get("speedup_bounds"),
        "pipeline_speedup_vs_sync_range": best.get("speedup_range"),
        "pipeline_wall_ratio": best.get("wall_ratio"),
        "pipeline_wall_ratio_range": best.get("wall_ratio_range"),
        "pipeline_speedup_vs": vs,
    }
    runs = {f"{n}/seed{seeds[i]}": r for i, s in enumerate(per_seed) for n, r in s.items()}
    (out / "bench_schedules.json").write_text(
        json.dumps({**line, "runs": runs}, indent=2, default=str)
    )
    print(json.dumps(line))
