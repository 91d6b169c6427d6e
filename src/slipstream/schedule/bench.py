"""`slipstream bench schedules`: the five presets on one task, same seed, same budget.

Each preset trains `run.steps` versions on the local runtime from the same warm start, with
the same seed and config (the defaults of `slipstream train`, plus any `key=value` given).
Held-out accuracy is measured on weight snapshots after each run (`runtime.defer_eval`), so
evaluation takes no time from training and every preset is timed the same way: the wall time
of the first evaluated step whose accuracy reaches the target.

The target is `--target` if given, else the start accuracy plus `--target-frac` (0.8) of the
way to `sync`'s final accuracy: a level `sync` is known to reach with this budget.

Prints a table, saves it (`bench_schedules.md`, `bench_schedules.json` in `--out`), and ends
with one JSON line:
`{"presets": {NAME: {"time_to_target_s", "final_acc", "sampler_busy", "trainer_wait",
"lag_mean", "lag_max", "ess"}}, "pipeline_speedup_vs_sync": X}`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from slipstream.config import load_config
from slipstream.schedule.presets import PRESETS

COLUMNS = (
    "time_to_target_s",
    "final_acc",
    "sampler_busy",
    "trainer_wait",
    "lag_mean",
    "lag_max",
    "ess",
)


def time_to_target(curve: list[dict[str, float]], target: float) -> float | None:
    """Wall seconds of the first evaluated step at or above `target` (None: never)."""
    for point in sorted(curve, key=lambda c: c["step"]):
        if point["heldout_acc"] >= target - 1e-12:
            return point["wall_s"]
    return None


def run_preset(name: str, out: Path, overrides: list[str], eval_every: int) -> dict[str, Any]:
    from slipstream.schedule.launch import train_async

    cfg = load_config(
        None,
        [
            f"eval.every={eval_every}",
            *overrides,
            f'run.dir="{out / name}"',
            f'schedule.name="{name}"',
            'runtime.kind="local"',
            "runtime.defer_eval=true",
            "run.quiet=true",
        ],
    )
    return train_async(cfg)


def table(results: dict[str, dict[str, Any]], target: float) -> str:
    lines = [
        f"target held-out accuracy {target:.3f}",
        "",
        "| preset | time to target (s) | final acc | wall (s) | sampler busy | trainer wait | lag mean | lag max | ESS token |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        ttt = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
        lines.append(
            f"| {name} | {ttt} | {r['final_acc']:.3f} | {r['wall_s']:.1f} | {100 * r['sampler_busy']:.0f}% "
            f"| {100 * r['trainer_wait']:.0f}% | {r['lag_mean']:.2f} | {r['lag_max']} | {r['ess']:.3f} |"
        )
    return "\n".join(lines)


def bench_schedules_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="slipstream bench schedules", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "overrides", nargs="*", help="key=value config overrides, applied to every preset"
    )
    parser.add_argument(
        "--presets", default=",".join(PRESETS), help="comma-separated (default: all five)"
    )
    parser.add_argument("--target", type=float, default=None, help="held-out accuracy to reach")
    parser.add_argument(
        "--target-frac",
        type=float,
        default=0.8,
        help="default target: start + frac x (sync final - start)",
    )
    parser.add_argument(
        "--eval-every", type=int, default=5, help="evaluate a snapshot every N steps"
    )
    parser.add_argument("--out", default=None, help="output folder (default runs/bench-<UTC time>)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.presets.split(",") if n.strip()]
    for n in names:
        if n not in PRESETS:
            parser.error(f"unknown preset {n!r}; valid: {', '.join(PRESETS)}")
    out = Path(args.out or f"runs/bench-{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    summaries = {}
    for n in sorted(names, key=lambda x: x != "sync"):  # sync first: it sets the default target
        print(f"bench: {n} ...", flush=True)
        summaries[n] = run_preset(n, out, list(args.overrides), args.eval_every)
        s = summaries[n]
        print(
            f"bench: {n} done in {s['wall_s']:.0f}s, held-out accuracy {s['heldout_acc_end']:.3f}",
            flush=True,
        )
    target = args.target
    if target is None:
        ref = summaries.get("sync") or next(iter(summaries.values()))
        start, end = ref["heldout_acc_start"], ref["heldout_acc_end"]
        target = start + args.target_frac * (end - start)
    results = {n: _result(summaries[n], target) for n in names}
    speedup = None
    if "sync" in results and "pipeline" in results:
        a, b = results["sync"]["time_to_target_s"], results["pipeline"]["time_to_target_s"]
        speedup = a / b if a is not None and b else None
    text = table(results, target)
    print(text)
    (out / "bench_schedules.md").write_text(text + "\n")
    line = {
        "presets": {n: {k: r[k] for k in COLUMNS} for n, r in results.items()},
        "pipeline_speedup_vs_sync": speedup,
    }
    (out / "bench_schedules.json").write_text(
        json.dumps({**line, "target": target, "runs": summaries}, indent=2, default=str)
    )
    print(json.dumps(line))
    return 0


def _result(s: dict[str, Any], target: float) -> dict[str, Any]:
    return {
        "time_to_target_s": time_to_target(s["heldout_curve"], target),
        "final_acc": s["heldout_acc_end"],
        "wall_s": s["wall_s"],
        "sampler_busy": s["sampler_busy"],
        "trainer_wait": s["trainer_wait"],
        "lag_mean": s["lag_mean"],
        "lag_max": s["lag_max"],
        "ess": s["ess_token"],
    }
