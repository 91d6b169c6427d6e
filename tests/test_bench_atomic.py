"""Bench result files that a later command reads back are written whole or not at all
(`slipstream.files.write_atomic`): a crash midway through a plain write left a torn file that
the next run then failed to read. Consistency checks of the sources: they read the scripts
for the calls, they do not crash one midway."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"

READ_BACK = {
    "agentic.py": ["agentic.json"],  # bench/agentic_plot.py
    "peer_harness.py": ["warmstart.json", "tokenizer_config.json"],  # peer_trl's cached harness
    "sim_calibration.py": ["host_load.json", "metrics.jsonl"],  # --no-record; tests/data
    "keep_runs.py": ["metrics.jsonl", "summary.json"],  # --reuse of the kept runs
    "beyond.py": ["results.json"],  # the runs of this call, for a later look
    "staleness.py": ["results.json"],
    "lag_policy.py": ["results.json"],
    "chaos.py": ["chaos.json"],
}

PLAIN = re.compile(r"""\.write_(text|bytes)\(|\bopen\([^)\n]*["'][wax]b?["']\)""")
"""A write in place: `Path.write_text`/`write_bytes`, or `open` for writing or appending."""

IN_PLACE = {
    # one JSON line appended per finished run, for a reader when a later run fails; not read back
    "agentic.py": ['"rows.jsonl"'],
    # the two runners' output streams, and one line appended per finished run (not read back)
    "peer_trl.py": ['_s{seed}.log"', '_s{seed}.log"', '"results.jsonl"'],
    # runs in TRL's environment, which has no slipstream; peer_trl reads trl.json only after
    # the worker exited with status 0
    "peer_trl_worker.py": ['"trl.json"'],
    # the dataset it measures the reading of, generated into a temporary folder, removed after
    "dataset_memory.py": ['path.write_text("".join(', "path.write_text(json.dumps(data)"],
}
"""Each script's writes in place that are meant to be, one marker a line."""


def test_consistency_read_back_files_are_written_with_write_atomic():
    for script, names in READ_BACK.items():
        text = (BENCH / script).read_text()
        for name in names:
            plain = re.compile(rf'"{re.escape(name)}"\)\.(write_text|open\("w"\))')
            assert not plain.search(text), f"{script} writes {name} in place"
            atomic = re.compile(rf'write_atomic\([^\n]*"{re.escape(name)}"')
            assert atomic.search(text), f"{script} does not write {name} with write_atomic"


def test_consistency_no_other_bench_write_in_place():
    for path in sorted(BENCH.glob("*.py")):
        allowed = list(IN_PLACE.get(path.name, []))
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if PLAIN.search(line):
                marker = next((m for m in allowed if m in line), None)
                assert marker is not None, f"bench/{path.name}:{i} writes in place: {line.strip()}"
                allowed.remove(marker)
        assert not allowed, f"bench/{path.name}: no write in place of {allowed} (update IN_PLACE)"
