"""How good is the run-duration forecast? Forecasts at 10 %, 25 % and 50 % of a run against
the run's actual end, over several runs of the built-in task.

Each run is `slipstream train` on the built-in task (the in-process sync loop, every core;
`runtime.kind=local schedule.name=pipeline` and the like run an orchestrated schedule),
`--steps` steps at `trainer.batch_prompts=--batch`, seeds 0..runs-1 (everything else the
defaults, evaluation every 20 steps and at the last). During the run every step record carries
`forecast/remaining_s` and its 90 % interval (`slipstream.sim.forecast`: the simulator
calibrated online on the run's own steps). The bench reads, at each checkpoint step k, the
forecast the run itself logged, and compares it with what was left: `wall_s` of the last step
minus `wall_s` of step k. Beside it, the pace ETA the live view used before (mean time per
step since the first step, times the steps left).

    flock /work/wt/notes/bench.lock timeout 900 python bench/forecast.py --out bench_out/forecast [key=value ...]

(5 runs of 50 steps at batch 32: ~5 minutes on this 2-core machine; `--from DIR` re-reads
runs already in DIR). Prints a table and ends with one JSON line:
`{"forecast_error_at_10pct", "forecast_error_at_25pct", "forecast_error_at_50pct"` (median
absolute relative error of the remaining time over the runs), `"forecast_coverage"` (share of
the runs x checkpoints whose actual remainder lies in the 90 % interval), `"pace_error_at_25pct"`,
`"runs"`, `"steps"}`. bench/beyond.py calls `run_and_measure` (or `measure` on run folders).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from slipstream.files import read_jsonl

CHECKPOINTS = (0.10, 0.25, 0.50)


def train_runs(
    out: Path, runs: int, steps: int, batch: int, overrides: tuple[str, ...] = ()
) -> list[Path]:
    """Train `runs` runs (seeds 0..runs-1) into out/seed<i>, with `key=value` config
    `overrides`; their folders."""
    import shutil

    from slipstream.config import load_config
    from slipstream.run.launch import train_async
    from slipstream.run.sync import train_sync

    dirs = []
    for seed in range(runs):
        d = out / f"seed{seed}"
        shutil.rmtree(d, ignore_errors=True)
        cfg = load_config(
            None,
            [
                f'run.dir="{d}"',
                f"run.steps={steps}",
                f"run.seed={seed}",
                "run.quiet=true",
                f"trainer.batch_prompts={batch}",
                *overrides,
            ],
        )
        print(f"run seed {seed} ...", flush=True)
        # as `slipstream train`: in process, or orchestrated (runtime.kind=local schedule.name=...)
        (train_sync if cfg.runtime_kind == "inprocess" else train_async)(cfg)
        dirs.append(d)
    return dirs


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    return read_jsonl(run_dir / "metrics.jsonl")


def score_run(rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    """At each checkpoint: the logged forecast, the pace ETA and the actual remainder (s)."""
    total, end = int(rows[-1]["step"]), float(rows[-1]["wall_s"])
    by_step = {int(r["step"]): r for r in rows}
    out = []
    logged = sorted(k for k, r in by_step.items() if "forecast/remaining_s" in r)
    for frac in CHECKPOINTS:
        # the first step at or after the checkpoint that logged a forecast (none before the 4th)
        k = next(s for s in logged if s >= round(frac * total))
        r = by_step[k]
        actual = end - float(r["wall_s"])
        first = by_step[min(by_step)]
        pace = (float(r["wall_s"]) - float(first["wall_s"])) / (k - int(first["step"]))
        out.append(
            {
                "frac": frac,
                "step": k,
                "actual_s": actual,
                "forecast_s": float(r["forecast/remaining_s"]),
                "lo_s": float(r["forecast/remaining_lo_s"]),
                "hi_s": float(r["forecast/remaining_hi_s"]),
                "pace_s": pace * (total - k),
            }
        )
    return out


def measure(dirs: list[Path]) -> dict[str, Any]:
    """The figures of the module doc over the runs in `dirs`, plus each forecast."""
    return measure_rows({str(d): read_rows(d) for d in dirs})


def measure_rows(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """`measure` on step records already read, by run name."""
    scored = {name: score_run(rows) for name, rows in runs.items()}
    line: dict[str, Any] = {}
    for i, frac in enumerate(CHECKPOINTS):
        pts = [s[i] for s in scored.values()]
        errs = [abs(p["forecast_s"] / p["actual_s"] - 1) for p in pts]
        pace = [abs(p["pace_s"] / p["actual_s"] - 1) for p in pts]
        line[f"forecast_error_at_{round(100 * frac)}pct"] = round(statistics.median(errs), 4)
        line[f"pace_error_at_{round(100 * frac)}pct"] = round(statistics.median(pace), 4)
    every = [p for s in scored.values() for p in s]
    hits = sum(p["lo_s"] <= p["actual_s"] <= p["hi_s"] for p in every)
    line["forecast_coverage"] = round(hits / len(every), 4)
    line["runs"] = len(runs)
    return {"line": line, "forecasts": scored}


def run_and_measure(out: Path, runs: int = 5, steps: int = 50, batch: int = 32) -> dict[str, Any]:
    """Train the runs and return the JSON line's figures (for bench/beyond.py)."""
    return measure(train_runs(out, runs, steps, batch))["line"]


def table(scored: dict[str, list[dict[str, float]]]) -> str:
    lines = [
        "| run | at | step | actual left (s) | forecast (s) | 90 % interval (s) | error | pace ETA error |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run, pts in scored.items():
        for p in pts:
            lines.append(
                f"| {Path(run).name} | {p['frac']:.0%} | {p['step']} | {p['actual_s']:.1f} "
                f"| {p['forecast_s']:.1f} | {p['lo_s']:.1f}-{p['hi_s']:.1f} "
                f"| {p['forecast_s'] / p['actual_s'] - 1:+.1%} | {p['pace_s'] / p['actual_s'] - 1:+.1%} |"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out/forecast")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--from", dest="src", default=None, help="score the runs in this folder")
    p.add_argument("overrides", nargs="*", help="key=value config settings for every run")
    args = p.parse_args()
    if args.src:
        dirs = sorted(d for d in Path(args.src).iterdir() if (d / "metrics.jsonl").is_file())
    else:
        dirs = train_runs(Path(args.out), args.runs, args.steps, args.batch, tuple(args.overrides))
    result = measure(dirs)
    print(table(result["forecasts"]))
    line = {**result["line"], "steps": int(read_rows(dirs[0])[-1]["step"])}
    print(json.dumps(line))


if __name__ == "__main__":
    main()
