"""Bench result files that a later command reads back are written whole or not at all
(`slipstream.files.write_atomic`): a crash midway through a plain write left a torn file that
the next run then failed to read. A consistency check of the sources: it reads the scripts for
the call, it does not crash one midway."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"

READ_BACK = {
    "agentic.py": ["agentic.json"],  # bench/agentic_plot.py
    "peer_harness.py": ["warmstart.json"],  # bench/peer_trl.py's cached harness
    "sim_calibration.py": ["host_load.json", "metrics.jsonl"],  # --no-record; tests/data
    "keep_runs.py": ["metrics.jsonl", "summary.json"],  # --reuse of the kept runs
}


def test_read_back_files_are_written_atomically():
    for script, names in READ_BACK.items():
        text = (BENCH / script).read_text()
        for name in names:
            plain = re.compile(rf'"{re.escape(name)}"\)\.(write_text|open\("w"\))')
            assert not plain.search(text), f"{script} writes {name} in place"
            atomic = re.compile(rf'write_atomic\([^\n]*"{re.escape(name)}"')
            assert atomic.search(text), f"{script} does not write {name} with write_atomic"
