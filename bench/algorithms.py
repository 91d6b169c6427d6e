"""The algorithm library on the built-in task: held-out accuracy against generated tokens.

Every run has the same seed, the same number of optimizer steps and the same B x G samples per
step, and uses the defaults of `slipstream train` for everything it does not vary. Three
comparisons:

- main loss/advantage combinations (filters at their defaults);
- no filters vs zero_variance + pass-rate band, in two settings: `zv+pass_rate_band`, the hard
  band at its defaults (a prompt whose pass rate over at least 16 samples is at or below 5 %
  or at or above 90 % is not drawn again), and `zv+soft_band`, the band as GRESO's selective rollouts (Zheng et
  al. 2025): `pass_rate_skip_prob=0.5`, a prompt outside the band is skipped with probability
  1 - 0.5^z after z uninformative groups in a row, and `pass_rate_min_attempts=8` (one group:
  a prompt excluded by an unlucky group still comes back half the time, so one group is
  enough evidence to start skipping). 0.5 is the even bet after one group; it is not tuned.
  For each, the generation tokens needed to first reach the accuracy the unfiltered run ends
  at: `filter_generation_savings = 1 - filtered/unfiltered` (headline: the hard band, the
  default a user gets; the soft band is in `filter_savings_by_run`);
- adaptive group size on/off, on top of the hard band.

The band skips hopeless prompts, which are the long ones, so a filtered run spends fewer tokens
per step and, in the same number of steps, less generation than the unfiltered run: it may stop
before it could reach the target. Each filtered run that used less than the unfiltered run's
tokens is therefore also run with the steps that match that token budget (`@same_tokens`, its
cosine schedule stretched to the longer run). The headline is measured on curves smoothed over
3 evaluations (trailing mean) with the crossing interpolated between evaluations, against the
unfiltered run's smoothed final accuracy: one evaluation of one seed moves by a few points, and
the unfiltered run's last evaluation is as likely a lucky one as not. It is the same-steps
figure, or the same-tokens one where the same-steps run stopped short; the raw figures (each
run's first evaluation at the unfiltered run's last) are printed beside it. `--seeds 0,1` runs
every seed, reports each, and takes the headline on the curves averaged over the seeds.

Training draws from the first `--pool` prompts of the task so that prompts recur, as epochs of
a fixed dataset do: the pass-rate band and adaptive group sizes act on prompts they have seen.
The filters can act only from a prompt's second draw on, so what they save depends on how many
epochs the run makes over its pool (steps x B / pool).

Measured (80 steps, B 64, G 8; savings against no_filters on smoothed curves, the raw figures
in brackets; n/a: never reached the target; tokens and accuracy at step 80):

  pool (epochs)  seed  hard band              soft band              tokens at step 80
  1280 (4)       0     n/a [n/a]              n/a [12.8 % same steps] -20 % hard, -13 % soft
  1280 (4)       1     24.8 % [23.9 %]        n/a [28.4 % same steps] -20 % hard, -15 % soft
  1280 (4)       mean  n/a: ends 0.350 vs 0.379  n/a: ends 0.373 vs 0.379
  640 (8)        0     18.4 % [22.6 %]        17.4 % [14.9 %]        -33 % hard, -23 % soft
  640 (8)        1     41.6 % [30.7 %]        15.9 % [4.8 %]         -31 % hard, -23 % soft
  640 (8)        mean  48.0 %                 33.7 %
  1280 (8), 160 steps  0  38.6 % [38.3 %]     34.5 % [33.6 %]        -33 % hard, -23 % soft

The 160-step setting over 16 seeds, on an earlier version of the code: its per-seed table is in
docs/filter_savings.md; the rerun on the current code is in the README's Algorithms section.

So the filters reliably cut generation per step, more the more epochs they get to act on, and
cost some accuracy per step. At 80 steps the saving at equal accuracy is within the noise of
two seeds: one seed's curve moves by 2 to 3 points between evaluations, and the unfiltered
curve is flat near its end; it is not reached at 4 epochs. Leaving a skipped prompt's slot empty (`pass_rate_refill=false`,
soft band, pool 1280, seed 0) halved generation per step from step 20 on but ended at 0.285
with 270k tokens, where the unfiltered run was at 0.297: no saving, one seed.

Commands: python bench/algorithms.py --steps 80 --seeds 0,1
    --only no_filters,zv+pass_rate_band,zv+soft_band [--pool 640];
    the 160-step rows: --steps 160 --pool 1280 with the same --only, one seed at a time
    (--seed S --runs-dir RUNS/seedS, two at once on 2 cores: about 22 min a pair), then all read
    back together: --seeds 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15 --reuse --runs-dir RUNS.

Run: python bench/algorithms.py [--steps 60] [--quick] [--out bench_out/algorithms.png]
     [--only no_filters,zv+pass_rate_band,zv+soft_band] [--seeds 0,1] [--reuse]
     [--set filters.pass_rate_min_attempts=24]
Prints a table, saves the plot and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from slipstream.config import load_config
from slipstream.files import read_jsonl
from slipstream.observe.runs import finished_summary
from slipstream.run.sync import train_sync

COMBOS = [  # (advantage, loss)
    ("grpo", "ppo"),
    ("rloo", "ppo"),
    ("dr_grpo", "dapo"),
    ("grpo", "cispo"),
    ("maxrl", "reinforce"),
    ("grpo", "dro"),
]
QUICK_COMBOS = [("grpo", "ppo"), ("maxrl", "reinforce")]
NO_FILTERS = ["filters.zero_variance=false", "filters.pass_rate_band=false"]
FILTERS = ["filters.zero_variance=true", "filters.pass_rate_band=true"]
# the band as GRESO's selective rollouts: skipped with probability 1 - (1 - s)^streak, so never
# excluded for good, which makes one group (G = 8) enough evidence to start skipping
SOFT = [*FILTERS, "filters.pass_rate_skip_prob=0.5", "filters.pass_rate_min_attempts=8"]


# filtered runs compared with no_filters; the first one present is the headline: the band at
# its defaults, what `filters.pass_rate_band=true` gives
FILTER_RUNS = ("zv+pass_rate_band", "zv+soft_band")
HEADLINE = (
    "headline estimator (fixed before the runs): generation saved to first reach no_filters' final"
    " accuracy, on the smoothed curves averaged over the seeds, hard band (zv+pass_rate_band); "
    "beside it the per-seed mean (never reached: 0) and the 90 % bootstrap interval over seeds"
)
HEADLINE_CMD = (
    "python bench/algorithms.py --steps 160 --pool 1280 --seeds 0,1,2,3,4,5,6,7,8,9,10,11,12,13,"
    "14,15 --only no_filters,zv+pass_rate_band,zv+soft_band   (16 seeds x 3 runs of 160 steps "
    "and the same-token reruns: 12-16 min a pair of seeds run side by side on this 2-core machine, "
    "1 h 47 min in all; or a seed at a time with --seed S --runs-dir RUNS/seedS, then --reuse)"
)


def plan(quick: bool) -> list[tuple[str, str, list[str]]]:
    """(name, comparison, overrides) of every run."""
    runs = [
        (f"{a}+{loss}", "combo", [f'trainer.advantage="{a}"', f'trainer.loss="{loss}"'])
        for a, loss in (QUICK_COMBOS if quick else COMBOS)
    ]
    runs.append(("no_filters", "filters", NO_FILTERS))
    runs.append(("zv+pass_rate_band", "filters", FILTERS))
    runs.append(("zv+soft_band", "filters", SOFT))
    runs.append(("zv+band+adaptive_G", "adaptive", [*FILTERS, "sampling.adaptive_group_size=true"]))
    return runs


def curve(run_dir: Path, acc_start: float) -> list[tuple[int, float]]:
    """(cumulative generated tokens, held-out accuracy) at each evaluation, from metrics.jsonl."""
    points, tokens = [(0, acc_start)], 0
    for r in read_jsonl(run_dir / "metrics.jsonl"):
        tokens += int(r["tokens/generated"])
        if "heldout_acc" in r:
            points.append((tokens, float(r["heldout_acc"])))
    return points


def tokens_to_reach(
    points: list[tuple[int, float]], target: float, interpolate: bool = False
) -> int | None:
    """Generated tokens at the first evaluation after the start at or above `target`; None if
    never. The start is left out: the target is something training has to reach. With
    `interpolate`, the tokens where the straight line from the evaluation before crosses the
    target: evaluations are 5 steps (about 6 % of the budget) apart, a coarse grid for a saving."""
    for i, (t, acc) in enumerate(points[1:], start=1):
        if acc >= target - 1e-9:
            t0, a0 = points[i - 1]
            if not interpolate or a0 >= target - 1e-9:  # the start may already be there
                return t
            return round(t0 + (t - t0) * (target - a0) / (acc - a0))
    return None


finished = finished_summary  # tests and callers of this script use that name


def run_one(
    name: str, overrides: list[str], common: list[str], out: Path, reuse: bool = False
) -> dict[str, Any]:
    cfg = load_config(None, [*common, f'run.dir="{out / name}"', *overrides])
    t0 = time.perf_counter()
    summary = (finished(cfg) if reuse else None) or train_sync(cfg)
    points = curve(out / name, summary["heldout_acc_start"])
    ledger = summary["ledger"]
    res = {
        "overrides": overrides,
        "steps": summary["steps"],
        "final_acc": summary["heldout_acc_end"],
        "generated_tokens": points[-1][0],
        "wall_s": round(summary.get("wall_s", time.perf_counter() - t0), 1),
        "filtered_groups": sum(ledger["filtered"].values()),
        "trained_groups": ledger["trained"],
        "prompts_skipped": sum(summary["prompts_skipped"].values()),
        "curve": points,
        "smoothed": smooth(points),
    }
    print(
        f"  {name}: acc {res['final_acc']:.3f}, {res['generated_tokens']:,} tokens, {res['wall_s']}s",
        file=sys.stderr,
    )
    return res


def plot(results: dict[str, dict[str, Any]], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    colors = plt.get_cmap("tab20").colors  # type: ignore[attr-defined]
    for i, (name, r) in enumerate(results.items()):
        xs, ys = zip(*r["curve"])
        style = "-" if r["comparison"] == "combo" else "--"
        ax.plot(
            xs,
            ys,
            style,
            marker="o",
            markersize=3,
            label=name,
            color=colors[(2 * i) % 20 + (2 * i) // 20],
        )
    ax.axhline(target, color="grey", linewidth=0.8, linestyle=":", label=f"target {target:.3f}")
    ax.set_xlabel("generated tokens (cumulative)")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_title("slipstream algorithms on the built-in task (same seed, same budget)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(results: dict[str, dict[str, Any]], target: float) -> str:
    head = (
        f"{'run':<31} {'steps':>5} {'final acc':>9} {'gen tokens':>11} {'to target':>10} "
        f"{'filtered':>8} {'skipped':>7} {'wall s':>6}"
    )
    rows = [head, "-" * len(head)]
    for name, r in results.items():
        reach = tokens_to_reach(r["curve"], target)
        rows.append(
            f"{name:<31} {r['steps']:>5} {r['final_acc']:>9.3f} {r['generated_tokens']:>11,} "
            f"{(f'{reach:,}' if reach is not None else 'never'):>10} {r['filtered_groups']:>8} "
            f"{r['prompts_skipped']:>7} {r['wall_s']:>6.0f}"
        )
    return "\n".join(rows)


def savings(
    base: dict[str, Any], other: dict[str, Any], target: float, key: str = "curve"
) -> float | None:
    """1 - tokens(other) / tokens(base) to first reach `target` on curves `key` (`curve`: each
    evaluation, the first one at the target; `smoothed`: trailing means, interpolated between
    evaluations); None if either never does."""
    interp = key == "smoothed"
    t_base = tokens_to_reach(base[key], target, interp)
    t_other = tokens_to_reach(other[key], target, interp)
    if t_base is None or t_other is None or t_base == 0:
        return None
    return 1.0 - t_other / t_base


def smooth(points: list[tuple[int, float]], k: int = 3) -> list[tuple[int, float]]:
    """Trailing mean of the accuracy over the last `k` evaluations (fewer at the start)."""
    accs = [a for _, a in points]
    return [
        (t, sum(accs[max(0, i - k + 1) : i + 1]) / (i + 1 - max(0, i - k + 1)))
        for i, (t, _) in enumerate(points)
    ]


def match_budget(
    results: dict[str, dict[str, Any]], steps: int, common: list[str], out: Path, reuse: bool
) -> None:
    """Rerun each filtered run that generated less than `no_filters` with the steps that match
    its token budget: `name@same_tokens`."""
    base = results.get("no_filters")
    for name in (*FILTER_RUNS, "zv+band+adaptive_G"):
        r = results.get(name)
        if base is None or r is None or r["generated_tokens"] >= 0.97 * base["generated_tokens"]:
            continue
        matched = math.ceil(steps * base["generated_tokens"] / r["generated_tokens"])
        more = [*r["overrides"], f"run.steps={matched}", f"checkpoint.every={matched}"]
        results[f"{name}@same_tokens"] = {
            "comparison": r["comparison"],
            **run_one(f"{name}@same_tokens", more, common, out, reuse),
        }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps of every run")
    ap.add_argument("--quick", action="store_true", help="two combinations, 12 steps: a smoke run")
    ap.add_argument("--out", type=Path, default=Path("bench_out/algorithms.png"), help="the plot")
    ap.add_argument(
        "--runs-dir", type=Path, default=None, help="run folders (default: beside --out)"
    )
    ap.add_argument(
        "--pool", type=int, default=None, help="training prompts (default: steps x B / 4)"
    )
    ap.add_argument("--eval-every", type=int, default=5, help="held-out evaluation every N steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--seeds",
        default="",
        help="comma-separated seeds, e.g. 0,1: every run for each seed (folders RUNS_DIR/seedN), "
        "a report for each, and the headline on the curves averaged over the seeds",
    )
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="read back a finished run whose folder holds the same config instead of training it",
    )
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated run names (default: all); e.g. no_filters,zv+pass_rate_band for "
        "the filter comparison alone (its @same_tokens rerun follows when needed)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for every run, after the shared ones (repeatable), e.g. "
        "filters.pass_rate_min_attempts=24 to try another band",
    )
    args = ap.parse_args(argv)
    if args.quick and args.steps == 60:
        args.steps = 12
    return args


def common_overrides(args: argparse.Namespace, seed: int) -> list[str]:
    """What every run shares; everything else is `slipstream train`'s default, read now."""
    d = load_config()
    pool = args.pool or max(64, args.steps * d.trainer.batch_prompts // 4)
    print(
        f"defaults: lr {d.trainer.lr}, B {d.trainer.batch_prompts}, G {d.sampling.group_size}, "
        f"temperature {d.sampling.temperature}, max_new_tokens {d.sampling.max_new_tokens}, "
        f"agg {d.trainer.agg}; {args.steps} steps, pool {pool}, seed {seed}",
        file=sys.stderr,
    )
    return [
        f"run.steps={args.steps}", f"run.seed={seed}", "run.threads=1", "run.quiet=true",
        "run.rollouts_per_step=0", f"eval.every={args.eval_every}", f"checkpoint.every={args.steps}",
        f"task.max_train_prompts={pool}", *args.set,
    ]  # fmt: skip


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def run_seed(args: argparse.Namespace, seed: int, out: Path) -> dict[str, dict[str, Any]]:
    """Every planned run (or those in `--only`) with `seed`, then the `@same_tokens` reruns."""
    common = common_overrides(args, seed)
    only = set(filter(None, args.only.split(",")))
    results: dict[str, dict[str, Any]] = {}
    for name, comparison, overrides in plan(args.quick):
        if not only or name in only:
            results[name] = {
                "comparison": comparison,
                **run_one(name, overrides, common, out, args.reuse),
            }
    match_budget(results, args.steps, common, out, args.reuse)
    return results


def mean_over_seeds(per_seed: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Runs present for every seed, their curves averaged evaluation by evaluation (tokens and
    accuracy), cut to the shortest: `@same_tokens` reruns differ in length between seeds."""
    out: dict[str, dict[str, Any]] = {}
    for name, first in per_seed[0].items():
        runs = [r[name] for r in per_seed if name in r]
        if len(runs) < len(per_seed):
            continue
        n = min(len(r["curve"]) for r in runs)
        pts = [
            (round(sum(r["curve"][i][0] for r in runs) / len(runs)),
             sum(r["curve"][i][1] for r in runs) / len(runs))
            for i in range(n)
        ]  # fmt: skip
        counts = ("wall_s", "filtered_groups", "trained_groups", "prompts_skipped")
        out[name] = {
            "comparison": first["comparison"],
            "overrides": first["overrides"],
            "steps": min(r["steps"] for r in runs),
            "final_acc": pts[-1][1],
            "generated_tokens": pts[-1][0],
            **{k: round(sum(r[k] for r in runs) / len(runs)) for k in counts},
            "curve": pts,
            "smoothed": smooth(pts),
        }
    return out


def bootstrap(
    per_seed: list[dict[str, dict[str, Any]]], n: int = 1000, goal: float = 0.30, seed: int = 0
) -> dict[str, dict[str, float]]:
    """How much the headline saving of each filter run depends on which seeds were run: the
    headline (mean curves, smoothed) of `n` resamples of the seeds with replacement. Per run:
    the 5th, 50th and 95th percentiles (`percentiles`: interpolated between order statistics)
    and the share of resamples at or above `goal`. A resample whose mean curve never reaches
    the target counts as the lowest saving (a percentile on one, or between one and a saving,
    is None)."""
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {name: [] for name in FILTER_RUNS}
    for _ in range(n):
        sample = [per_seed[rng.randrange(len(per_seed))] for _ in per_seed]
        mean = mean_over_seeds(sample)
        for name in draws:
            if name in mean:
                h = savings_pair(mean, "no_filters", name)["headline"]
                draws[name].append(-math.inf if h is None else h)
    out = {}
    for name, v in draws.items():
        if not v:
            continue
        q = {f"p{p}": x for p, x in zip((5, 50, 95), percentiles(v, (5, 50, 95)), strict=True)}
        out[name] = {**q, "share_at_least_goal": sum(x >= goal for x in v) / len(v)}
    return out


def percentiles(v: list[float], ps: tuple[int, ...]) -> list[float | None]:
    """The percentiles `ps` (1 to 99) of `v`, interpolated linearly between the order
    statistics (statistics.quantiles' `inclusive` method, numpy's default: the p-th at rank
    (len - 1) p / 100 from 0). `-inf` is a resample that never reached the target: a
    percentile on one, or between one and a saving, is None."""
    if len(v) == 1:
        cuts = [v[0]] * 99
    else:
        cuts = statistics.quantiles(v, n=100, method="inclusive")
    return [cuts[p - 1] if math.isfinite(cuts[p - 1]) else None for p in ps]


def per_seed_summary(lines: list[dict[str, Any]]) -> dict[str, dict[str, float | int]]:
    """Per filter run, over the seeds' own reports: the mean saving (a seed whose run never
    reached the target counts 0) and how many seeds never reached it."""
    out: dict[str, dict[str, float | int]] = {}
    for name in FILTER_RUNS:
        runs = [ln["filter_savings_by_run"] for ln in lines]
        vals = [r[name]["headline"] for r in runs if name in r]
        if vals:
            out[name] = {
                "mean": sum(v or 0.0 for v in vals) / len(vals),
                "never": sum(v is None for v in vals),
                "seeds": len(vals),
            }
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.runs_dir or args.out.parent / "algorithms_runs"
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    print(HEADLINE)
    quick = len(seeds) < 16 or args.steps != 160
    if quick:
        print(
            f"QUICK RUN ({args.steps} steps, {len(seeds)} seed(s)): not the headline. The "
            f"headline's command:\n  {HEADLINE_CMD}"
        )
    per_seed = [run_seed(args, s, out if len(seeds) == 1 else out / f"seed{s}") for s in seeds]
    lines = []
    for s, results in zip(seeds, per_seed):
        if len(seeds) > 1:
            print(f"\n== seed {s}")
        path = args.out if len(seeds) == 1 else args.out.with_stem(f"{args.out.stem}_seed{s}")
        lines.append(report(results, path))
    line = lines[0]
    if len(seeds) > 1:
        print(f"\n== mean over seeds {seeds} (the headline)")
        line = report(mean_over_seeds(per_seed), args.out)
        line["seeds"] = seeds
        boot = bootstrap(per_seed)
        for name, b in boot.items():
            share = b["share_at_least_goal"]
            print(
                f"{name}: headline over 1000 resamples of the seeds: 90 % within "
                f"{_pct(b['p5'])} .. {_pct(b['p95'])} (median {_pct(b['p50'])}); "
                f"at least 30 % in {share:.0%} of them"
            )
        line["filter_savings_bootstrap"] = boot
        summary = per_seed_summary(lines)
        for name, sm in summary.items():
            b = boot.get(name, {})
            head = line["filter_savings_by_run"].get(name, {}).get("headline")
            print(
                f"{name}: headline {_pct(head)}; per-seed mean {_pct(sm['mean'])}; bootstrap "
                f"90 % {_pct(b.get('p5'))} .. {_pct(b.get('p95'))}; {sm['never']} of "
                f"{sm['seeds']} seeds never reached the target"
            )
        line["filter_savings_per_seed"] = summary
        line["per_seed"] = {
            str(s): {
                "filter_generation_savings": ln["filter_generation_savings"],
                "filter_savings_by_run": ln["filter_savings_by_run"],
                "target_acc": ln["target_acc"],
            }
            for s, ln in zip(seeds, lines)
        }
    line["quick_run"] = quick
    if quick:
        print(f"quick run, not the headline; the headline: {HEADLINE_CMD}")
    print(json.dumps(line))
    return 0


def savings_pair(
    results: dict[str, dict[str, Any]], base: str, name: str
) -> dict[str, float | None]:
    """Savings of `name` against `base`, with the same steps and with the same tokens, on raw
    and on smoothed curves. Raw: the target is `base`'s last evaluation, and each run's first
    evaluation at or above it counts. Smoothed (the headline): every curve is a trailing mean
    over 3 evaluations, the target is `base`'s last smoothed value and crossings are
    interpolated between evaluations: one evaluation of one seed moves by a few points, and a
    saving read off a single lucky or unlucky evaluation says little. The headline takes the
    same-steps run, or the same-tokens one where the same-steps run stopped short of the target
    (it had generated less than `base`, so it could not show any saving)."""
    b, r, m = results.get(base), results.get(name), results.get(f"{name}@same_tokens")
    if base.startswith("zv+"):  # adaptive G against filters alone, each at its own budget
        b_m = results.get(f"{base}@same_tokens", b)
    else:
        b_m = b
    out: dict[str, float | None] = {}
    for key, label in (("curve", ""), ("smoothed", "_smoothed")):
        out[f"same_steps{label}"] = out[f"same_tokens{label}"] = None
        if b and r:
            out[f"same_steps{label}"] = savings(b, r, b[key][-1][1], key)
        if b_m and m:
            out[f"same_tokens{label}"] = savings(b_m, m, b_m[key][-1][1], key)
    steps, tokens = out["same_steps_smoothed"], out["same_tokens_smoothed"]
    return {"headline": steps if steps is not None else tokens, **out}


def report(results: dict[str, dict[str, Any]], plot_path: Path) -> dict[str, Any]:
    """Print the table and the savings, save the plot; the JSON summary."""
    base = results.get("no_filters")
    target = base["final_acc"] if base else max(r["final_acc"] for r in results.values())
    if base and target <= base["curve"][0][1]:
        print(f"warning: no_filters ends at {target:.3f}, not above its start: savings undefined")
    by_run = {n: savings_pair(results, "no_filters", n) for n in FILTER_RUNS if n in results}
    ads = savings_pair(results, "zv+pass_rate_band", "zv+band+adaptive_G")
    print(table(results, target))
    smoothed_target = base["smoothed"][-1][1] if base else None
    print(
        f"target accuracy (no_filters final): {target:.3f}; smoothed over its last 3 "
        f"evaluations: {smoothed_target if smoothed_target is None else round(smoothed_target, 3)}"
    )
    rows = [(f"filters ({n} vs none)", sv) for n, sv in by_run.items()]
    for label, sv in [*rows, ("adaptive G (vs zv+pass_rate_band)", ads)]:
        print(
            f"{label}: generation savings to target {_pct(sv['headline'])} "
            f"[smoothed: same steps {_pct(sv['same_steps_smoothed'])}, same tokens "
            f"{_pct(sv['same_tokens_smoothed'])}; raw: same steps {_pct(sv['same_steps'])}, "
            f"same tokens {_pct(sv['same_tokens'])}]"
        )
    plot(results, target, plot_path)
    print(f"plot: {plot_path}")
    keys = ("steps", "final_acc", "generated_tokens", "filtered_groups", "prompts_skipped")
    runs = {
        name: {k: r[k] for k in keys} | {"tokens_to_target": tokens_to_reach(r["curve"], target)}
        for name, r in results.items()
    }
    headline = next((n for n in FILTER_RUNS if n in by_run), None)
    return {
        "filter_generation_savings": by_run[headline]["headline"] if headline else None,
        "filter_headline_run": headline,
        "filter_savings_detail": by_run.get(headline or "", {}),
        "filter_savings_by_run": by_run,
        "adaptive_group_size_savings": ads["headline"],
        "adaptive_savings_detail": ads,
        "target_acc": target,
        "target_acc_smoothed": smoothed_target,
        "combos": {n: v for n, v in runs.items() if results[n]["comparison"] == "combo"},
        "filters": {n: v for n, v in runs.items() if results[n]["comparison"] != "combo"},
    }


if __name__ == "__main__":
    sys.exit(main())
