"""bench/sim.py's goodput table has a header for every column it prints."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import sim as bench


def test_goodput_table_columns_match_the_header():
    row = {"recovery_h": 0.5, "goodput": 0.9, "goodput_mc": 0.89, "goodput_p10": 0.85,
           "goodput_p90": 0.93, "wasted_musd": 5.4, "spares_musd": 1.2}  # fmt: skip
    head, line = bench.goodput_lines({"hot_spares": row})
    assert head.split() == ["strategy", "recovery", "goodput", "MC", "mean", "p10-p90",
                            "wasted", "spares"]  # fmt: skip
    assert line.split() == ["hot_spares", "0.50h", "90.0%", "89.0%", "85.0%-93.0%", "5.4M", "1.2M"]
    # each value ends under the end of its header (right-aligned columns)
    for word in ("goodput", "p10-p90", "wasted", "spares"):
        end = head.index(word) + len(word)
        assert line[end - 1] != " " and (end == len(line) or line[end] == " ")
