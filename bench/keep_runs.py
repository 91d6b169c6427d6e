"""Keep the part of benchmark run folders that a later readback needs, small enough to commit.

A benchmark's run folders (`bench_out/...`, ignored by git) vanish with the machine they ran
on; a headline that takes several sessions to measure (bench/algorithms.py's 16 seeds) needs
its finished runs kept. This copies every finished run folder under SRC (one holding
`summary.json` and `config.toml`) to the same relative path under DST, with `metrics.jsonl`
cut down to the keys given (by default every key that bench/algorithms.py's `curve` and
bench/agentic.py's `measures` read), so that a readback reads them as if they had just run
(bench/algorithms.py `--reuse --runs-dir DST`, bench/agentic.py `--reuse --out DST`).
Checkpoints, logs and everything else are left out.

Run: python bench/keep_runs.py SRC DST [--keys step,tokens/generated,heldout_acc,...]

Prints one line per run kept and ends with one JSON line: {"runs": N, "bytes": total}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from slipstream.files import write_atomic
from slipstream.observe.clock import EVAL_S, EVAL_START_S
from slipstream.observe.runs import HELDOUT_KEYS

KEYS = (
    "step",
    "tokens/generated",
    *HELDOUT_KEYS,
    "wall_s",
    "step_time_s",  # the weight of a step's busy share
    EVAL_S,
    EVAL_START_S,  # the clock of deferred evaluation (observe.clock)
    "engine/busy_frac",
    "runtime/sampler_busy",
    "staleness/ess_token",
    "staleness/lag_mean",
    "staleness/lag_hist",
    "env/turns_mean",
)
"""What bench/algorithms.py's `curve` and bench/agentic.py's `measures` read of a run's records."""


def trim_metrics(text: str, keys: tuple[str, ...]) -> str:
    """metrics.jsonl with every record cut to `keys` (in that order; absent keys stay absent)."""
    out = []
    for line in text.splitlines():
        if line.strip():
            record = json.loads(line)
            out.append(json.dumps({k: record[k] for k in keys if k in record}))
    return "".join(x + "\n" for x in out)


def finished_runs(src: Path) -> list[Path]:
    """Every folder under `src` (itself included) that holds a finished run."""
    marks = sorted(src.rglob("summary.json"))
    return [m.parent for m in marks if (m.parent / "config.toml").is_file()]


def keep(src: Path, dst: Path, keys: tuple[str, ...] = KEYS) -> list[Path]:
    """Copy the kept part of every finished run under `src` to `dst`; the copies' folders."""
    kept = []
    for run in finished_runs(src):
        target = dst / run.relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(run / "config.toml", target / "config.toml")
        metrics = run / "metrics.jsonl"
        if metrics.is_file():
            write_atomic(target / "metrics.jsonl", trim_metrics(metrics.read_text(), keys))
        # last: a `--reuse` reads back a folder with summary.json, and then its metrics
        write_atomic(target / "summary.json", (run / "summary.json").read_text(encoding="utf-8"))
        kept.append(target)
    return kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--keys", default=",".join(KEYS), help="metrics.jsonl keys to keep")
    args = ap.parse_args(argv)
    if not args.src.is_dir():
        print(f"no such folder: {args.src}", file=sys.stderr)
        return 2
    kept = keep(args.src, args.dst, tuple(k for k in args.keys.split(",") if k))
    total = 0
    for folder in kept:
        size = sum(f.stat().st_size for f in folder.iterdir())
        total += size
        print(f"{folder}  {size / 1024:.1f} KiB")
    print(json.dumps({"runs": len(kept), "bytes": total}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
