"""Exact replay across the schedules: record a small run of each, replay it, compare.

Each case trains a random model of the built-in architecture on a JSONL copy of the running-sums
task (a reward a random model earns half the time: odd-length completions), on the local
runtime with `run.record_schedule=true`, then runs `slipstream replay` on it in this process.
Reported per case: the steps, metric values that differ (timings excluded,
`run.replay_compare.TIMINGS`), whether the final weights are equal (torch.equal), the record's
size (bytes of RUN_DIR/schedule/ per step), the original run's wall time (its `wall_s`, from the
first work issued to the end; the process start and sampler spawn before it are given apart as
`total_s`) and the replay's.

Run: python bench/replay.py [--steps 6] [--cases all|name,name] [--out bench_out/replay]
The last line is one JSON object: `exact` (cases replayed bit for bit / cases), per case
`bytes_per_step`, `original_wall_s`, `original_total_s`, `replay_wall_s`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

CASES = {
    "sync": ['schedule.name="sync"'],
    "tail_batching": ['schedule.name="tail_batching"'],
    "double_buffer-r2": ['schedule.name="double_buffer"', "schedule.redundant=2"],
    "async-keep": ['schedule.name="async"', "schedule.max_lag=1", 'schedule.lag_policy="keep"'],
    "pipeline-abort": [
        'schedule.name="pipeline"',
        "schedule.max_lag=1",
        'schedule.lag_policy="abort"',
    ],
    "pipeline-abort-K0": [  # K = 0 with in-flight loads: groups are cut by the abort rule
        'schedule.name="pipeline"',
        "schedule.max_lag=0",
        'schedule.lag_policy="abort"',
    ],
    "async-drop-K0": ['schedule.name="async"', "schedule.max_lag=0", 'schedule.lag_policy="drop"'],
    "pipeline-abort-2samplers": [  # few slots, long completions: groups outlive two steps
        'schedule.name="pipeline"',
        "schedule.max_lag=1",
        'schedule.lag_policy="abort"',
        "runtime.num_samplers=2",
        "runtime.sampler_slots=4",
        "sampling.max_new_tokens=40",
    ],
    "async-drop-2samplers": [
        'schedule.name="async"',
        "schedule.max_lag=1",
        'schedule.lag_policy="drop"',
        "runtime.num_samplers=2",
        "runtime.sampler_slots=4",
        "sampling.max_new_tokens=40",
    ],
    "pipeline-minlag": ['schedule.name="pipeline"', "schedule.max_lag=1", "schedule.min_lag=1"],
    "pipeline-2samplers": [
        'schedule.name="pipeline"',
        "schedule.max_lag=2",
        'schedule.lag_policy="keep"',
        "runtime.num_samplers=2",
    ],
    "pipeline-auto-2samplers": [  # K tuned at window boundaries (it reads the trainer's wait)
        'schedule.name="pipeline"',
        'schedule.max_lag="auto"',
        "schedule.auto_wait_min=0",
        "runtime.num_samplers=2",
    ],
    "pipeline-auto-rollback": [  # a 30x lr spike at step 3; step_kl's rollback to step 2
        'schedule.name="pipeline"',
        'schedule.max_lag="auto"',
        "schedule.auto_wait_min=0",
        "watchdog.enabled=true",
        "watchdog.inject_lr_spike_at=3",
        "watchdog.inject_lr_spike_steps=1",
        'watchdog.actions={step_kl="rollback"}',
    ],
}
REWARD = "def odd(prompt, completion):\n    return float(len(completion) % 2)\n"


def assets(out: Path) -> Path:
    """The tiny run inputs of the replay tests (tests/tiny.write_assets), made once in
    out/assets."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny import write_assets

    tmp = out / "assets"
    if (tmp / "rows.jsonl").exists():
        return tmp
    tmp.mkdir(parents=True, exist_ok=True)
    return write_assets(tmp, REWARD)


def overrides(a: Path, run_dir: Path, steps: int) -> list[str]:
    return [
        f'run.dir="{run_dir}"',
        f"run.steps={steps}",
        "run.quiet=true",
        "run.threads=1",
        "run.record_schedule=true",
        f'model.path="{a / "model"}"',
        'task.kind="jsonl"',
        f'task.path="{a / "rows.jsonl"}"',
        f'task.reward="{a / "reward.py"}:odd"',
        "sampling.max_new_tokens=16",
        "trainer.lr=6e-4",  # the built-in model's (a model.path run defaults to TRL's 1e-6)
        "trainer.batch_prompts=4",
        "sampling.group_size=4",
        "eval.every=2",
        "eval.num_prompts=8",
        "checkpoint.every=2",
        'runtime.kind="local"',
        "runtime.trainer_threads=1",
        "runtime.threads_per_sampler=1",
    ]


def run_case(name: str, a: Path, out: Path, steps: int) -> dict:
    from slipstream.config import load_config
    from slipstream.run.launch import train_async
    from slipstream.run.replay_run import replay

    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.perf_counter()
    summary = train_async(load_config(None, [*overrides(a, run_dir, steps), *CASES[name]]))
    total = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in (run_dir / "schedule").iterdir())
    r = replay(run_dir, [], str(run_dir / "replay"))
    ledger = json.loads((run_dir / "ledger.json").read_text())
    return {
        "aborted": ledger["aborted"],
        "stale": ledger["stale"],
        "case": name,
        "steps": r["steps_compared"],
        "differ": r["metric_differences"],
        "weights_equal": r["weights_equal"],
        "bytes_per_step": size / steps,
        "original_wall_s": summary["wall_s"],
        "original_total_s": total,
        "replay_wall_s": r["replay_wall_s"],
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--cases", default="all")
    ap.add_argument("--out", default="bench_out/replay")
    args = ap.parse_args(argv)
    names = list(CASES) if args.cases == "all" else args.cases.split(",")
    out = Path(args.out).resolve()
    a = assets(out)
    rows = [run_case(n, a, out, args.steps) for n in names]
    print(f"{'case':20} {'steps':>5} {'differ':>6} {'weights':>7} {'B/step':>8} "
          f"{'orig s':>7} {'+spawn':>7} {'replay s':>8} {'abort/stale':>11}")  # fmt: skip
    for r in rows:
        print(
            f"{r['case']:20} {r['steps']:5d} {r['differ']:6d} {r['weights_equal']!s:>7} "
            f"{r['bytes_per_step']:8.0f} {r['original_wall_s']:7.1f} {r['original_total_s']:7.1f} "
            f"{r['replay_wall_s']:8.1f} {r['aborted']:5d}/{r['stale']:<5d}"
        )
    exact = sum(r["differ"] == 0 and r["weights_equal"] is True for r in rows)
    print(json.dumps({"exact": f"{exact}/{len(rows)}", "cases": rows}))
    return 0 if exact == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
