"""Peak memory of reading a large dataset file (`slipstream.tasks.datasets.read_table`).

Users bring JSONL, JSON or Parquet files of 100k-10M rows. This writes one of about `--mb`
megabytes (GSM8K-like rows: a question of 150-450 characters, an answer, an id), then reads it
`--repeats` times, each in a fresh process (so each peak is its own), and prints the median:

- `peak_mb`: the process's peak resident memory while reading, less what it held before;
- `held_mb`: what it holds after (the rows), less the same;
- `peak_over_held`: the first over the second; 1.0 means nothing but the rows was ever held.

Run: python bench/dataset_memory.py [--mb 200] [--kind jsonl|json|parquet] [--repeats 3]
     [--dir DIR] (the file is written there, and reused when there already)

Prints one line per read and ends with one JSON line of the medians. Linux only (it reads
/proc/self/statm). Compare two checkouts by running it with each one's `src` on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, os, resource, sys, time
from slipstream.tasks.datasets import read_table

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

before = rss_mb()
t = time.perf_counter()
rows = read_table(sys.argv[1])
wall = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
print(json.dumps({"rows": len(rows), "peak_mb": peak - before, "held_mb": rss_mb() - before,
                  "read_s": wall}))
"""


def rows(mb: float, seed: int = 0) -> list[dict[str, object]]:
    """Rows of about `mb` megabytes as JSON lines."""
    rng = random.Random(seed)
    words = ["apples", "Natalia", "sold", "clips", "to", "48", "of", "her", "friends", "in"]
    out, size = [], 0
    while size < mb * 2**20:
        q = " ".join(rng.choice(words) for _ in range(rng.randint(25, 75)))
        row = {"id": len(out), "question": q + "?", "answer": str(rng.randint(0, 10**6))}
        out.append(row)
        size += len(json.dumps(row)) + 1
    return out


def write(path: Path, kind: str, mb: float) -> None:
    data = rows(mb)
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in data), encoding="utf-8")
    elif kind == "json":
        path.write_text(json.dumps(data), encoding="utf-8")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(data), path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200.0)
    ap.add_argument("--kind", choices=("jsonl", "json", "parquet"), default="jsonl")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    a = ap.parse_args()
    path = a.dir / f"dataset_memory_{a.mb:g}mb.{a.kind}"
    if not path.exists():
        write(path, a.kind, a.mb)
    file_mb = path.stat().st_size / 2**20
    found = []
    for _ in range(a.repeats):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True
        )
        found.append(json.loads(out.stdout))
        print(json.dumps(found[-1]), flush=True)
    med = {k: statistics.median(f[k] for f in found) for k in ("peak_mb", "held_mb", "read_s")}
    med["peak_over_held"] = med["peak_mb"] / med["held_mb"]
    print(json.dumps({"file": str(path), "file_mb": file_mb, "rows": found[0]["rows"], **med}))


if __name__ == "__main__":
    main()
