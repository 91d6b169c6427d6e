"""What a stale group's fate does to learning: the `pipeline` schedule at K = `--lag` on the
built-in task with a group older than K dropped (`schedule.lag_policy = "drop"`, the default)
against kept and trained with its importance correction ("keep"), the same seeds, steps and
batch, runs interleaved (seed, then policy). Each run as bench/beyond.py's `run_one` makes it
(evaluation deferred; time to the target as training time; final held-out accuracy).

Why: over 30 seeds (stop 32) the fixed K = 2 ended 1.36 points above `max_lag = "auto"`
(bench/results/beyond_s32.txt), and K = 2 drops the most groups as stale, the long ones; this
measures whether dropping them is worth accuracy by itself.

Run: python bench/lag_policy.py [--seeds 30,...,44] [--steps 50] [--lag 2]
     [--policies drop,keep] [--out bench_out/lag_policy] [key=value ...]
     [--target-gain 0.12] (stop 41: trainer.batch_prompts=32 warmstart.seed=0, beyond_s32's sizes)
Ends with one JSON line: per policy the median final accuracy, time to target (whether that
median is a time to target: `time_median_reached`) and runs that reached it, and each other policy's accuracy minus the first's, paired by seed, in points
with a 90 % bootstrap interval (`acc_paired_points`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from slipstream.files import write_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
import beyond  # bench/beyond.py: run_one, paired


def summarize(res: dict[str, list[dict]]) -> dict[str, Any]:
    """Medians per policy, and every policy but the first against the first, paired by seed."""
    first = next(iter(res))
    out: dict[str, Any] = {}
    for pol, runs in res.items():
        done = [r for r in runs if r["acc"] is not None]
        out[pol] = {
            "acc_median": statistics.median(r["acc"] for r in done) if done else None,
            "time_to_target_median": statistics.median(r["time_to_target"] for r in done)
            if done
            else None,
            # False: that median is an unreached run's whole training time, not a time to
            # target (beyond.median_reached), as bench/beyond.py says of its own medians
            "time_median_reached": beyond.median_reached(done) if done else None,
            "reached": sum(bool(r["reached"]) for r in runs),
            "runs": len(runs),
        }
    out["acc_paired_points"] = {
        pol: beyond.paired(res, first, other=pol) for pol in res if pol != first
    }
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default=",".join(str(s) for s in range(30, 45)))
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--lag", type=int, default=2)
    ap.add_argument("--policies", default="drop,keep")
    ap.add_argument(
        "--target-gain", type=float, default=0.12, help="each run's target: its start + this"
    )
    ap.add_argument("--out", default="bench_out/lag_policy")
    args, extra = ap.parse_known_args(argv)
    args.ckpt_every = args.steps  # run_one's checkpoint interval: none needed here
    args.target = None  # run_one's fixed target: unused, the gain sets each run's
    res: dict[str, list[dict]] = {p: [] for p in args.policies.split(",")}
    for seed in (int(x) for x in args.seeds.split(",")):
        for pol in res:
            overrides = [f"schedule.max_lag={args.lag}", f'schedule.lag_policy="{pol}"']
            r = beyond.run_one(f"{pol}_s{seed}", [*overrides, f"run.seed={seed}"], args, extra)
            res[pol].append({**r, "seed": seed})
            acc = "stopped" if r["acc"] is None else f"acc {r['acc']:.3f}"
            print(
                f"lag_policy: K={args.lag} {pol} seed={seed}: {acc}, training time to target "
                f"{r['time_to_target'] or 0:.1f}s{'' if r['reached'] else ' (not reached)'}",
                flush=True,
            )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(args.out) / "results.json", json.dumps(res) + "\n")
    summary = summarize(res)
    print(f"| K={args.lag} policy | final acc (median) | time to target (median, s) | reached |")
    print("| --- | --- | --- | --- |")
    for pol in res:
        s = summary[pol]
        acc = "-" if s["acc_median"] is None else f"{s['acc_median']:.3f}"
        t = "-" if s["time_to_target_median"] is None else f"{s['time_to_target_median']:.1f}"
        if s["time_median_reached"] is False:
            t += " (a run's budget: not reached)"
        print(f"| {pol} | {acc} | {t} | {s['reached']}/{s['runs']} |")
    for pol, p in summary["acc_paired_points"].items():
        print(f"{pol} minus {next(iter(res))}, points of final accuracy: {beyond._paired_text(p)}")
    print(json.dumps({"lag": args.lag, "steps": args.steps, **summary}))
    return 0


if __name__ == "__main__":  # the sampler processes are spawned: they import this module
    sys.exit(main(sys.argv[1:]))
