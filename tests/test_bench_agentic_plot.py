"""bench/agentic_plot.py: speedups per (tail, seed) pair from bench/agentic.py's runs, their
medians, and the figure."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import agentic_plot as bench


def _run(
    tail: float, seed: int, schedule: str, wall: float, train: float, ttt: float | None
) -> dict:
    return {
        "tail": tail,
        "seed": seed,
        "schedule": schedule,
        "wall_s": wall,
        "train_s": train,
        "time_to_target_s": ttt,
    }


RUNS = [
    _run(1, 0, "sync", 8.0, 6.0, 4.0), _run(1, 0, "pipeline", 4.0, 4.0, 2.0),
    _run(30, 0, "sync", 30.0, 24.0, None), _run(30, 0, "pipeline", 10.0, 8.0, 3.0),
    _run(30, 1, "sync", 36.0, 30.0, 12.0), _run(30, 1, "pipeline", 9.0, 10.0, 4.0),
    _run(30, 1, "async", 1.0, 1.0, 1.0),  # not a pipeline/sync pair: ignored
]  # fmt: skip

# bench/agentic.py's figures for RUNS: budget on training time (tail 1: 6/4; tail 30: 24/8 and
# 30/10), on the wall clock beside it (8/4; 30/10 and 36/9: median 3.5); time to target at
# tail 30: seed 0's sync never reached it (None, as agentic.json's), within [median(24/3, 3),
# median(inf, 3)] = [5.5, inf]; the old median over the seeds both reached (3.0) is gone
LINE = {
    "budget_speedup_by_tail": {"1": 1.5, "30": 3.0},
    "budget_wall_speedup_by_tail": {"1": 2.0, "30": 3.5},
    "speedup_by_tail": {"1": 2.0, "30": None},
    "speedup_bounds_by_tail": {"1": [2.0, 2.0], "30": [5.5, None]},
}


def test_speedups_pair_sync_with_pipeline_per_tail_and_seed():
    # the figure's points: tail 1: 8/4 = 2; tail 30: 30/10 = 3 and 36/9 = 4
    assert bench.per_seed(RUNS, "wall_s") == {1.0: [2.0], 30.0: [3.0, 4.0]}
    # time to target: seed 0 at tail 30 has no sync figure (target not reached): no point
    assert bench.per_seed(RUNS, "time_to_target_s") == {1.0: [2.0], 30.0: [3.0]}


def test_the_line_means_what_agentic_json_means():
    """A key named as one of agentic.json's is computed as bench/agentic.py computes it:
    `speedup_by_tail` None where a run never reached the target, `budget_speedup_by_tail` on
    training time (the wall clock's ratio has its own key)."""
    import agentic

    assert bench.summary_line(RUNS) == LINE
    for tail, key in ((30.0, "time_to_target_s"), (30.0, "train_s"), (1.0, "train_s")):
        name = "speedup_by_tail" if key == "time_to_target_s" else "budget_speedup_by_tail"
        assert LINE[name][f"{tail:g}"] == agentic.speedup(RUNS, "sync", "pipeline", tail, key)


def test_the_table_marks_censored_seeds_and_an_undecided_median():
    text = bench.table(RUNS, bench.per_seed(RUNS, "train_s"), LINE)
    assert "| 30 | 2 | 3.00 (3.00, 3.00) | undecided, within 5.50-inf (>=8.00, 3.00) |" in text
    assert "| 1 | 1 | 1.50 (1.50) | 2.00, within 2.00-2.00 (2.00) |" in text


@pytest.mark.slow  # matplotlib's import
def test_main_prints_the_line_and_draws(tmp_path, capsys, monkeypatch):
    src = tmp_path / "agentic.json"
    src.write_text(json.dumps({"runs": RUNS}))
    png = tmp_path / "s.png"
    monkeypatch.setattr(sys, "argv", ["agentic_plot.py", str(src), "--out", str(png)])
    bench.main()
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line == LINE
    assert png.stat().st_size > 1000
