"""bench/engine.py's figures over repeats: a share printed under "median of N" is the median
of the timed runs' shares, not the last run's and not the warm-up's."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import engine as bench


def test_the_share_is_the_median_of_the_timed_runs():
    # warm-up 0.9 (dropped), then 0.2, 0.1, 0.3: median 0.2, last 0.3
    values = iter([0.9, 0.2, 0.1, 0.3])
    t = bench.side_by_side({"a": lambda: next(values)}, repeats=3)["a"]
    assert t.results == (0.2, 0.1, 0.3)
    assert t.result == 0.3
    assert bench.median_result(t) == 0.2
