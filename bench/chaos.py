"""Chaos: SIGKILL a random sampler N times during one run; the run must finish with nothing
lost or trained twice.

Runs the same config twice on the local runtime, same seed: once undisturbed, once with
`runtime.chaos_kills = N` (a random sampler SIGKILLed every `--every` seconds). The killed
samplers are restarted with the latest weights and their requests issued again; the ledger
counts each request that died with a sampler as `lost`.

Run: python bench/chaos.py [--kills 20] [--every 2.5] [--no-baseline] [key=value ...]

Prints a table and ends with one JSON line:
`{"kills", "completed", "ledger_ok", "groups_trained_twice", "goodput", ...}`. `completed`:
the run trained all its steps; `ledger_ok`: every generated group ended in exactly one place
(trained, filtered, stale, aborted, lost, or still queued at the end) and every lost request was
issued again (none skipped); `groups_trained_twice`: groups whose prompt and seeds had already
been trained (must be 0); `goodput`: useful time over wall time (README, "Goodput").
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

from slipstream.files import write_atomic

DEFAULTS = [
    'schedule.name="pipeline"',
    "runtime.num_samplers=2",
    "run.steps=100",
    "eval.every=25",
]


def run(out: Path, overrides: list[str], kills: int, every: float) -> dict[str, Any]:
    from slipstream.config import load_config
    from slipstream.run.launch import train_async

    cfg = load_config(
        None,
        [
            *DEFAULTS,
            *overrides,
            f'run.dir="{out}"',
            'runtime.kind="local"',
            "run.quiet=true",
            f"runtime.chaos_kills={kills}",
            f"runtime.chaos_every_s={every}",
            f"runtime.max_restarts={max(kills, 3)}",
        ],
    )
    t0 = time.perf_counter()
    try:
        summary = train_async(cfg)
        summary["completed"] = summary["steps"] == cfg.run.steps
    except Exception as e:  # a failed run is a result here: report it
        summary = {"completed": False, "error": f"{type(e).__name__}: {e}"}
        ledger = out / "ledger.json"
        summary["ledger"] = json.loads(ledger.read_text()) if ledger.exists() else {}
    summary["bench_wall_s"] = time.perf_counter() - t0
    return summary


def ledger_ok(s: dict[str, Any]) -> bool:
    """The run's ledger balanced, and every request issued (re-issues included) came back, was
    lost, or is still out. A request a sampler had started and not delivered when the run
    ended is both in `groups_unfinished` (still outstanding) and in the ledger's `generated`
    (as `unfinished`): counted once."""
    led = s.get("ledger", {})
    out = s.get("groups_unfinished", 0) - led.get("unfinished", 0)
    return bool(led.get("balanced")) and s.get("groups_issued") == led.get("generated", -1) + out


def row(name: str, s: dict[str, Any]) -> str:
    led = s.get("ledger", {})
    return (
        f"| {name} | {s.get('chaos_kills', 0)} | {s.get('sampler_restarts', 0)} | {s['completed']} "
        f"| {s.get('steps', '-')} | {led.get('generated', '-')} | {led.get('trained', '-')} "
        f"| {led.get('lost', '-')} | {led.get('balanced', '-')} | {s.get('groups_trained_twice', '-')} "
        f"| {s.get('tokens_lost', '-')} | {s.get('restart_downtime_s', 0):.1f} "
        f"| {s.get('wall_s', s['bench_wall_s']):.1f} | {s.get('goodput', 0):.3f} "
        f"| {s.get('heldout_acc_end', float('nan')):.3f} |"
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="key=value config overrides (both runs)")
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--every", type=float, default=2.5, help="seconds between kills")
    p.add_argument("--no-baseline", action="store_true", help="skip the undisturbed run")
    p.add_argument("--out", default=None, help="output folder (default runs/chaos-<UTC time>)")
    args = p.parse_args(argv)
    out = Path(args.out or f"runs/chaos-{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}")
    results = {}
    if not args.no_baseline:
        print("chaos: undisturbed run ...", flush=True)
        results["undisturbed"] = run(out / "undisturbed", args.overrides, 0, args.every)
    print(f"chaos: {args.kills} kills, one every {args.every:g}s ...", flush=True)
    chaos = results["chaos"] = run(out / "chaos", args.overrides, args.kills, args.every)
    print(
        "| run | kills | restarts | completed | steps | groups generated | trained | lost "
        "| ledger balanced | trained twice | tokens lost | downtime (s) | wall (s) | goodput | final acc |"
    )
    print(
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    for name, s in results.items():
        print(row(name, s))
    led = chaos.get("ledger", {})
    line = {
        "kills": chaos.get("chaos_kills", 0),
        "completed": chaos["completed"],
        # balanced, and every request issued (re-issues included) came back, was lost, or is
        # still out at the end: none skipped
        "ledger_ok": ledger_ok(chaos),
        "groups_trained_twice": chaos.get("groups_trained_twice"),
        "goodput": chaos.get("goodput"),
        "goodput_undisturbed": results.get("undisturbed", {}).get("goodput"),
        "groups_lost": led.get("lost"),
        "tokens_lost": chaos.get("tokens_lost"),
        "restart_downtime_s": chaos.get("restart_downtime_s"),
        "wall_s": chaos.get("wall_s"),
        "wall_s_undisturbed": results.get("undisturbed", {}).get("wall_s"),
    }
    write_atomic(out / "chaos.json", json.dumps({**line, "runs": results}, indent=2, default=str))
    print(json.dumps(line))
    return 0 if line["completed"] and line["ledger_ok"] and line["groups_trained_twice"] == 0 else 1


if __name__ == "__main__":  # the sampler processes are spawned: they import this module
    sys.exit(main(sys.argv[1:]))
