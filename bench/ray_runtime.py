"""The Ray runtime against the local runtime: the same config and seed, side by side.

Run: python bench/ray_runtime.py [--steps 30] [--repeats 1] [key=value ...]

Both runs train the default task (built-in model and warm start) with the given schedule
(default `pipeline`), evaluation deferred to after the run (`runtime.defer_eval`), so `wall`
is the training loop alone, measured the same way on both. `total` adds each runtime's start
(Ray's own start, actors, model builds) and shutdown. With `--repeats N` the runtimes
alternate (local, ray, ray, local, ...), so a machine shared with other work loads both
alike, and each row is the run of median wall time. Prints a table and ends with one JSON
line: `{"ray_over_local_wall_ratio": X, "local": {...}, "ray": {...}}` (X: the ratio of the
median walls). Target: X <= 1.2.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slipstream.config import load_config
from slipstream.run.launch import train_async


def run(kind: str, out: Path, steps: int, overrides: list[str]) -> dict[str, Any]:
    cfg = load_config(
        None,
        [
            'schedule.name="pipeline"',
            *overrides,
            f"run.steps={steps}",
            f"eval.every={steps}",
            f'run.dir="{out}"',
            f'runtime.kind="{kind}"',
            "runtime.defer_eval=true",
            "run.quiet=true",
        ],
    )
    t0 = time.perf_counter()
    s = train_async(cfg)
    total = time.perf_counter() - t0
    ledger = s["ledger"]
    return {
        "wall_s": round(s["wall_s"], 2),
        "total_s": round(total, 2),
        "final_acc": s["heldout_acc_end"],
        "sampler_busy": round(s.get("sampler_busy", 0.0), 3),
        "trainer_wait": round(s.get("trainer_wait", 0.0), 3),
        "ledger": f"{ledger['generated']} gen / {ledger['trained']} trained / "
        f"{sum(ledger['filtered'].values())} filtered / {ledger['stale']} stale / "
        f"{ledger['lost']} lost, balanced {ledger['balanced']}",
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="key=value, applied to both runs")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each, alternating")
    parser.add_argument("--out", default=None, help="run folders (default: a temporary one)")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_ray_"))
    runs: dict[str, list[dict[str, Any]]] = {"local": [], "ray": []}
    for r in range(args.repeats):
        for kind in ("local", "ray") if r % 2 == 0 else ("ray", "local"):
            runs[kind].append(run(kind, out / f"{kind}{r}", args.steps, args.overrides))
            print(f"{kind} #{r}: wall {runs[kind][-1]['wall_s']:.1f}s", flush=True)
    res = {k: sorted(v, key=lambda x: x["wall_s"])[(len(v) - 1) // 2] for k, v in runs.items()}
    for k, v in runs.items():
        res[k]["walls_s"] = [x["wall_s"] for x in v]
    print("| runtime | wall (s) | total (s) | final acc | sampler busy | trainer wait | ledger |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for kind, r in res.items():
        print(
            f"| {kind} | {r['wall_s']:.1f} | {r['total_s']:.1f} | {r['final_acc']:.3f} "
            f"| {100 * r['sampler_busy']:.0f}% | {100 * r['trainer_wait']:.0f}% | {r['ledger']} |"
        )
    ratio = res["ray"]["wall_s"] / res["local"]["wall_s"]
    print(
        json.dumps(
            {
                "ray_over_local_wall_ratio": round(ratio, 3),
                "steps": args.steps,
                "repeats": args.repeats,
                **res,
            }
        )
    )
    return 0


if __name__ == "__main__":  # sampler processes are spawned: they import this module
    sys.exit(main(sys.argv[1:]))
