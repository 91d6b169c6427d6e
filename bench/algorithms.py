"""The algorithm library on the built-in task: held-out accuracy against generated tokens.

Every run has the same seed, the same number of optimizer steps and the same B x G samples per
step, and uses the defaults of `slipstream train` for everything it does not vary. Three
comparisons:

- main loss/advantage combinations (filters at their defaults);
- no filters vs zero_variance + pass_rate_band: the generation tokens each needs to first reach
  the accuracy the unfiltered run ends at (`filter_generation_savings = 1 - filtered/unfiltered`);
- adaptive group size on/off, on top of the filtered run.

The pass-rate band skips hopeless prompts, which are the long ones, so a filtered run spends
fewer tokens per step and, in the same number of steps, less generation than the unfiltered
run: it may stop before it could reach the target. Each filtered run that used less than the
unfiltered run's tokens is therefore also run with the steps that match that token budget
(`@same_tokens`, its cosine schedule stretched to the longer run). The headline saving is the
same-steps figure, or the same-tokens one where the same-steps run stopped short of the target;
both are printed, with the same-steps figure on curves smoothed over 3 evaluations, since one
evaluation of one seed moves by a few points.

Training draws from the first `--pool` prompts of the task so that prompts recur, as epochs of
a fixed dataset do: the pass-rate band and adaptive group sizes act on prompts they have seen.

Run: python bench/algorithms.py [--steps 60] [--quick] [--out bench_out/algorithms.png]
     [--only no_filters,zv+pass_rate_band] [--set filters.pass_rate_min_attempts=24]
Prints a table, saves the plot and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from slipstream.config import load_config
from slipstream.schedule.sync import train_sync

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


def plan(quick: bool) -> list[tuple[str, str, list[str]]]:
    """(name, comparison, overrides) of every run."""
    runs = [
        (f"{a}+{loss}", "combo", [f'trainer.advantage="{a}"', f'trainer.loss="{loss}"'])
        for a, loss in (QUICK_COMBOS if quick else COMBOS)
    ]
    runs.append(("no_filters", "filters", NO_FILTERS))
    runs.append(("zv+pass_rate_band", "filters", FILTERS))
    runs.append(("zv+band+adaptive_G", "adaptive", [*FILTERS, "sampling.adaptive_group_size=true"]))
    return runs


def curve(run_dir: Path, acc_start: float) -> list[tuple[int, float]]:
    """(cumulative generated tokens, held-out accuracy) at each evaluation, from metrics.jsonl."""
    points, tokens = [(0, acc_start)], 0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        tokens += int(r["tokens/generated"])
        if "heldout_acc" in r:
            points.append((tokens, float(r["heldout_acc"])))
    return points


def tokens_to_reach(points: list[tuple[int, float]], target: float) -> int | None:
    """Generated tokens at the first evaluation after the start at or above `target`; None if
    never. The start is left out: the target is something training has to reach."""
    return next((t for t, acc in points[1:] if acc >= target - 1e-9), None)


def run_one(name: str, overrides: list[str], common: list[str], out: Path) -> dict[str, Any]:
    cfg = load_config(None, [*common, f'run.dir="{out / name}"', *overrides])
    t0 = time.perf_counter()
    summary = train_sync(cfg)
    points = curve(out / name, summary["heldout_acc_start"])
    ledger = summary["ledger"]
    res = {
        "overrides": overrides,
        "steps": summary["steps"],
        "final_acc": summary["heldout_acc_end"],
        "generated_tokens": points[-1][0],
        "wall_s": round(time.perf_counter() - t0, 1),
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
    """1 - tokens(other) / tokens(base) to first reach `target`; None if either never does."""
    t_base, t_other = tokens_to_reach(base[key], target), tokens_to_reach(other[key], target)
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
    results: dict[str, dict[str, Any]], steps: int, common: list[str], out: Path
) -> None:
    """Rerun each filtered run that generated less than `no_filters` with the steps that match
    its token budget: `name@same_tokens`."""
    base = results.get("no_filters")
    for name in ("zv+pass_rate_band", "zv+band+adaptive_G"):
        r = results.get(name)
        if base is None or r is None or r["generated_tokens"] >= 0.97 * base["generated_tokens"]:
            continue
        matched = math.ceil(steps * base["generated_tokens"] / r["generated_tokens"])
        more = [*r["overrides"], f"run.steps={matched}", f"checkpoint.every={matched}"]
        results[f"{name}@same_tokens"] = {
            "comparison": r["comparison"],
            **run_one(f"{name}@same_tokens", more, common, out),
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


def common_overrides(args: argparse.Namespace) -> list[str]:
    """What every run shares; everything else is `slipstream train`'s default, read now."""
    d = load_config()
    pool = args.pool or max(64, args.steps * d.trainer.batch_prompts // 4)
    print(
        f"defaults: lr {d.trainer.lr}, B {d.trainer.batch_prompts}, G {d.sampling.group_size}, "
        f"temperature {d.sampling.temperature}, max_new_tokens {d.sampling.max_new_tokens}, "
        f"agg {d.trainer.agg}; {args.steps} steps, pool {pool}, seed {args.seed}",
        file=sys.stderr,
    )
    return [
        f"run.steps={args.steps}", f"run.seed={args.seed}", "run.threads=1", "run.quiet=true",
        "run.rollouts_per_step=0", f"eval.every={args.eval_every}", f"checkpoint.every={args.steps}",
        f"task.max_train_prompts={pool}", *args.set,
    ]  # fmt: skip


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.runs_dir or args.out.parent / "algorithms_runs"
    common = common_overrides(args)
    only = set(filter(None, args.only.split(",")))
    results: dict[str, dict[str, Any]] = {}
    for name, comparison, overrides in plan(args.quick):
        if not only or name in only:
            results[name] = {"comparison": comparison, **run_one(name, overrides, common, out)}
    match_budget(results, args.steps, common, out)
    line = report(results, args.out)
    print(json.dumps(line))
    return 0


def savings_pair(
    results: dict[str, dict[str, Any]], base: str, name: str, target: float
) -> dict[str, float | None]:
    """Savings of `name` against `base` with the same steps and with the same tokens; the
    headline is the same-steps figure, or the same-tokens one where the same-steps run stopped
    short of the target (it had generated less than `base`, so it could not show any saving)."""
    b, r, m = results.get(base), results.get(name), results.get(f"{name}@same_tokens")
    if base == "zv+pass_rate_band":  # adaptive G against filters alone, each at its own budget
        b_m = results.get(f"{base}@same_tokens", b)
    else:
        b_m = b
    same_steps = savings(b, r, target) if b and r else None
    same_tokens = savings(b_m, m, target) if b_m and m else None
    smoothed = savings(b, r, b["smoothed"][-1][1], "smoothed") if b and r else None
    return {
        "headline": same_steps if same_steps is not None else same_tokens,
        "same_steps": same_steps,
        "same_tokens": same_tokens,
        "same_steps_smoothed": smoothed,
    }


def report(results: dict[str, dict[str, Any]], plot_path: Path) -> dict[str, Any]:
    """Print the table and the savings, save the plot; the JSON summary."""
    base = results.get("no_filters")
    target = base["final_acc"] if base else max(r["final_acc"] for r in results.values())
    if base and target <= base["curve"][0][1]:
        print(f"warning: no_filters ends at {target:.3f}, not above its start: savings undefined")
    fs = savings_pair(results, "no_filters", "zv+pass_rate_band", target)
    ads = savings_pair(results, "zv+pass_rate_band", "zv+band+adaptive_G", target)
    print(table(results, target))
    print(f"target accuracy (no_filters final): {target:.3f}")
    for label, sv in (("filters (zv+band vs none)", fs), ("adaptive G (vs zv+band)", ads)):
        print(
            f"{label}: generation savings to target {_pct(sv['headline'])} "
            f"[same steps {_pct(sv['same_steps'])}; same tokens {_pct(sv['same_tokens'])}; "
            f"same steps, curves smoothed over 3 evaluations {_pct(sv['same_steps_smoothed'])}]"
        )
    plot(results, target, plot_path)
    print(f"plot: {plot_path}")
    keys = ("steps", "final_acc", "generated_tokens", "filtered_groups", "prompts_skipped")
    runs = {
        name: {k: r[k] for k in keys} | {"tokens_to_target": tokens_to_reach(r["curve"], target)}
        for name, r in results.items()
    }
    return {
        "filter_generation_savings": fs["headline"],
        "filter_savings_detail": fs,
        "adaptive_group_size_savings": ads["headline"],
        "adaptive_savings_detail": ads,
        "target_acc": target,
        "combos": {n: v for n, v in runs.items() if results[n]["comparison"] == "combo"},
        "filters": {n: v for n, v in runs.items() if results[n]["comparison"] != "combo"},
    }


if __name__ == "__main__":
    sys.exit(main())
