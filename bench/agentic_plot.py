"""The speedup of `pipeline` over `sync` against the tool latency's tail, from bench/agentic.py.

Reads the `agentic.json` that `python bench/agentic.py --out DIR` writes and plots, per tail
(p99 / median of the tool's lognormal latency), pipeline's speedup over sync for the same
budget of steps (sync's training time over pipeline's, evaluation excluded: bench/agentic.py's
`train_s`) and in time to the target (its `time_to_target_s`: training time, evaluation
excluded); each seed where both runs have the figure is a point, the lines join the medians,
and a vertical bar spans the time-to-target median's bounds where a run never reached the
target. The issue's claim to test: asynchrony matters more as rollouts get longer and more
skewed.

The figures are bench/agentic.py's own (`speedup`, `seed_bounds`, imported), so a key here
means what the same key of `agentic.json` means: a time-to-target median is None where a run
never reached the target, never a median over the seeds that both reached.

Run: python bench/agentic_plot.py DIR/agentic.json [--out speedup_by_tail.png]
Prints a table and ends with one JSON line, each {tail: median over seeds}:
`budget_speedup_by_tail` (training time of the budget, as agentic.json's),
`budget_wall_speedup_by_tail` (its wall clock), `speedup_by_tail` (time to target; null where
a run never reached it, as agentic.json's) and `speedup_bounds_by_tail` ([low, high] of that
median with an unreached run censored at its budget, an unbounded end null).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from agentic import seed_bounds, speedup
from slipstream.observe.censored import finite_or_none, median_bounds

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


def summary_line(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The JSON line of the module doc, by tail: bench/agentic.py's definitions."""
    tails = sorted({float(r["tail"]) for r in runs})
    return {
        "budget_speedup_by_tail": {
            f"{t:g}": speedup(runs, "sync", "pipeline", t, "train_s") for t in tails
        },
        "budget_wall_speedup_by_tail": {
            f"{t:g}": speedup(runs, "sync", "pipeline", t, "wall_s") for t in tails
        },
        "speedup_by_tail": {f"{t:g}": speedup(runs, "sync", "pipeline", t) for t in tails},
        "speedup_bounds_by_tail": {
            f"{t:g}": finite_or_none(median_bounds(seed_bounds(runs, "sync", "pipeline", t)))
            for t in tails
        },
    }


def _bound(lo: float, hi: float) -> str:
    """A seed's time-to-target speedup as printed: `2.14`, `>=6.00`, `<=0.50` or `?`."""
    if lo == hi:
        return f"{lo:.2f}"
    if math.isinf(hi):
        return f">={lo:.2f}" if lo > 0 else "?"
    return f"<={hi:.2f}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(runs: list[dict[str, Any]], budget: Pairs, line: dict[str, dict[str, Any]]) -> str:
    """Per tail: the budget speedup (median; per seed) and the time-to-target speedup (median,
    or `undecided`; its bounds; per seed, `<=`/`>=` where a run never reached the target)."""
    out = [
        "| tail p99/median | seeds | budget speedup, training: median (per seed) "
        "| time-to-target speedup: median, within (per seed) |",
        "| ---: | ---: | --- | --- |",
    ]
    for t in sorted(float(x) for x in line["speedup_by_tail"]):
        seeds = seed_bounds(runs, "sync", "pipeline", t)
        lo, hi = line["speedup_bounds_by_tail"][f"{t:g}"] or (None, None)
        med = line["speedup_by_tail"][f"{t:g}"]
        out.append(
            f"| {t:g} | {len(seeds)} | {_num(line['budget_speedup_by_tail'][f'{t:g}'])} "
            f"({', '.join(_num(x) for x in budget.get(t, []))}) "
            f"| {'undecided' if med is None else _num(med)}, within {_num(lo)}-"
            f"{'inf' if hi is None else _num(hi)} ({', '.join(_bound(*x) for x in seeds)}) |"
        )
    return "\n".join(out)


def plot(budget: Pairs, target: Pairs, line: dict[str, dict[str, Any]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    tails = sorted(float(t) for t in line["speedup_by_tail"])
    for pairs, key, label, marker in (
        (budget, "budget_speedup_by_tail", "same budget of steps", "o"),
        (target, "speedup_by_tail", "time to target", "s"),
    ):
        color = "C0" if marker == "o" else "C1"
        for t in sorted(pairs):
            ax.scatter([t] * len(pairs[t]), pairs[t], marker=marker, alpha=0.4, color=color)
        med = [line[key][f"{t:g}"] for t in tails]
        ax.plot(tails, [math.nan if m is None else m for m in med], marker=marker, label=label)
    for t in tails:  # where a run never reached the target: the median's bounds
        lo, hi = line["speedup_bounds_by_tail"][f"{t:g}"] or (None, None)
        if lo is not None and hi is not None and lo != hi:
            ax.vlines(t, lo, hi, color="C1", lw=2, alpha=0.6)
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
    budget, target = per_seed(runs, "train_s"), per_seed(runs, "time_to_target_s")
    line = summary_line(runs)
    print(table(runs, budget, line))
    plot(budget, target, line, Path(args.out))
    print(f"figure: {args.out}")
    print(json.dumps(line))


if __name__ == "__main__":
    main()
