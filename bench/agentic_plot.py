"""The speedup of `pipeline` over `sync` against the tool latency's tail, from bench/agentic.py.

Reads the `agentic.json` that `python bench/agentic.py --out DIR` writes and plots, per tail
(p99 / median of the tool's lognormal latency), pipeline's speedup over sync for the same
budget of steps (sync's wall time over pipeline's) and, where both reached the target, in time
to the target (bench/agentic.py's `time_to_target_s`: training time, evaluation excluded); each seed is a point, the line joins the medians. The issue's claim to test:
asynchrony matters more as rollouts get longer and more skewed.

Run: python bench/agentic_plot.py DIR/agentic.json [--out speedup_by_tail.png]
Prints a table and ends with one JSON line: `budget_speedup_by_tail` and `speedup_by_tail`
({tail: median over seeds, null where no seed pair has the figure}).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

Pairs = dict[float, list[float]]  # tail -> per-seed speedups


def per_seed(runs: list[dict[str, Any]], key: str) -> Pairs:
    """Sync's `key` over pipeline's for each (tail, seed) that has both runs and both values."""
    by = {(r["tail"], r["seed"], r["schedule"]): r.get(key) for r in runs}
    out: Pairs = {}
    for tail, seed, schedule in by:
        if schedule != "sync":
            continue
        s, p = by[(tail, seed, "sync")], by.get((tail, seed, "pipeline"))
        if s is not None and p is not None and p > 0:
            out.setdefault(float(tail), []).append(s / p)
    return out


def medians(pairs: Pairs) -> dict[str, float]:
    return {f"{t:g}": statistics.median(v) for t, v in sorted(pairs.items())}


def plot(budget: Pairs, target: Pairs, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for pairs, label, marker in (
        (budget, "same budget of steps", "o"),
        (target, "time to target", "s"),
    ):
        if not pairs:
            continue
        tails = sorted(pairs)
        for t in tails:
            ax.scatter(
                [t] * len(pairs[t]),
                pairs[t],
                marker=marker,
                alpha=0.4,
                color="C0" if marker == "o" else "C1",
            )
        ax.plot(tails, [statistics.median(pairs[t]) for t in tails], marker=marker, label=label)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("tool latency p99 / median")
    ax.set_ylabel("pipeline speedup over sync")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="the agentic.json of a bench/agentic.py run")
    ap.add_argument("--out", default="speedup_by_tail.png", help="the figure (PNG)")
    args = ap.parse_args()
    runs = json.loads(Path(args.results).read_text())["runs"]
    budget, target = per_seed(runs, "wall_s"), per_seed(runs, "time_to_target_s")
    print(
        "| tail p99/median | seeds | budget speedup (median, per seed) | time-to-target speedup |"
    )
    print("| ---: | ---: | --- | --- |")
    for t in sorted(budget):
        b = ", ".join(f"{x:.2f}" for x in budget[t])
        tt = ", ".join(f"{x:.2f}" for x in target.get(t, [])) or "-"
        print(f"| {t:g} | {len(budget[t])} | {statistics.median(budget[t]):.2f} ({b}) | {tt} |")
    plot(budget, target, Path(args.out))
    print(f"figure: {args.out}")
    tails = sorted(budget)
    line = {
        "budget_speedup_by_tail": medians(budget),
        "speedup_by_tail": {
            f"{t:g}": (statistics.median(target[t]) if target.get(t) else None) for t in tails
        },
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
