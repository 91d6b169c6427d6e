"""bench/forecast.py scores each run at the first step of a checkpoint that logged a forecast."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import forecast as bench


def _rows(steps: int, step_s: float = 2.0) -> list[dict]:
    rows = []
    for k in range(1, steps + 1):
        r = {"step": k, "wall_s": k * step_s}
        if k >= 4:  # the run's forecast starts at its fourth step
            left = (steps - k) * step_s
            r |= {
                "forecast/remaining_s": left,
                "forecast/remaining_lo_s": 0.9 * left,
                "forecast/remaining_hi_s": 1.1 * left,
            }
        rows.append(r)
    return rows


def test_a_short_run_is_scored_from_its_first_forecast():
    # 20 steps: 10 % is step 2, before any forecast: scored at step 4 (was a KeyError at 3)
    pts = bench.score_run(_rows(20))
    assert [p["step"] for p in pts] == [4, 5, 10]
    assert pts[0]["actual_s"] == 32.0 == pts[0]["forecast_s"]
    # pace: (8 - 2) s over 3 steps = 2 s a step, 16 steps left
    assert pts[0]["pace_s"] == 32.0


def test_coverage_counts_actuals_inside_the_interval():
    line = bench.measure_rows({"a": _rows(50), "b": _rows(50)})["line"]
    assert line["forecast_coverage"] == 1.0
    assert line["forecast_error_at_25pct"] == 0.0
