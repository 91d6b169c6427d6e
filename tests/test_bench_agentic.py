"""bench/agentic.py's lag distribution is summed from what step records hold."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import agentic as bench


def test_lag_counts_sum_the_step_histograms():
    # lag 0: 3 + 1, lag 1: 0 + 4, lag 2: 2; a step without a histogram (no training) adds none
    records = [{"staleness/lag_hist": [3, 0, 2]}, {"staleness/lag_hist": [1, 4]}, {"step": 3}]
    assert bench.lag_counts(records) == {"0": 4, "1": 4, "2": 2}
    assert bench.lag_counts([{"staleness/lag_hist": []}]) == {}


def test_paired_difference_and_its_standard_error():
    import agentic_paired

    # differences b - a: 0, +1, 0, -1 -> mean 0, sample variance (0+1+0+1)/3 = 2/3,
    # standard error sqrt(2/3 / 4) = 0.408...
    out = agentic_paired.paired([1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0])
    assert out["acc_a"] == out["acc_b"] == 0.5 and out["diff"] == 0.0
    assert abs(out["paired_se"] - (2 / 3 / 4) ** 0.5) < 1e-12
    assert (out["b_only"], out["a_only"]) == (1, 1)
