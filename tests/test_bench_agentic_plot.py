"""bench/agentic_plot.py: speedups per (tail, seed) pair from bench/agentic.py's runs, their
medians, and the figure."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import agentic_plot as bench


def _run(tail: float, seed: int, schedule: str, wall: float, ttt: float | None) -> dict:
    return {
        "tail": tail,
        "seed": seed,
        "schedule": schedule,
        "wall_s": wall,
        "time_to_target_s": ttt,
    }


RUNS = [
    _run(1, 0, "sync", 8.0, 4.0), _run(1, 0, "pipeline", 4.0, 2.0),
    _run(30, 0, "sync", 30.0, None), _run(30, 0, "pipeline", 10.0, 3.0),
    _run(30, 1, "sync", 36.0, 12.0), _run(30, 1, "pipeline", 9.0, 4.0),
    _run(30, 1, "async", 1.0, 1.0),  # not a pipeline/sync pair: ignored
]  # fmt: skip


def test_speedups_pair_sync_with_pipeline_per_tail_and_seed():
    # wall: tail 1: 8/4 = 2; tail 30: 30/10 = 3 and 36/9 = 4 -> median 3.5
    assert bench.per_seed(RUNS, "wall_s") == {1.0: [2.0], 30.0: [3.0, 4.0]}
    assert bench.medians(bench.per_seed(RUNS, "wall_s")) == {"1": 2.0, "30": 3.5}
    # time to target: seed 0 at tail 30 has no sync figure (target not reached): left out
    assert bench.per_seed(RUNS, "time_to_target_s") == {1.0: [2.0], 30.0: [3.0]}


@pytest.mark.slow  # matplotlib's import
def test_main_prints_the_line_and_draws(tmp_path, capsys, monkeypatch):
    src = tmp_path / "agentic.json"
    src.write_text(json.dumps({"runs": RUNS}))
    png = tmp_path / "s.png"
    monkeypatch.setattr(sys, "argv", ["agentic_plot.py", str(src), "--out", str(png)])
    bench.main()
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line == {
        "budget_speedup_by_tail": {"1": 2.0, "30": 3.5},
        "speedup_by_tail": {"1": 2.0, "30": 3.0},
    }
    assert png.stat().st_size > 1000
