"""The report draws the held-out curve of a run evaluated with `runtime.defer_eval`, whose
accuracy is only in summary.json's `heldout_curve` (every run of `bench schedules`)."""

from __future__ import annotations

import json
from pathlib import Path

from slipstream.observe.figures import heldout_figure
from slipstream.observe.runs import load_run


def _deferred_run(tmp_path: Path) -> Path:
    d = tmp_path / "deferred"
    d.mkdir()
    rows = [{"step": s, "wall_s": 2.0 * s, "tokens/generated": 100} for s in (1, 2, 3, 4)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    curve = [
        {"step": 0, "wall_s": 0.0, "heldout_acc": 0.1},
        {"step": 2, "wall_s": 3.9, "heldout_acc": 0.3},
        {"step": 4, "wall_s": 7.9, "heldout_acc": 0.5},
    ]
    summary = {"heldout_acc_start": 0.1, "heldout_acc_end": 0.5, "heldout_curve": curve}
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_the_heldout_figure_draws_a_deferred_runs_curve(tmp_path):
    run = load_run(_deferred_run(tmp_path))
    assert [(r["step"], v) for r, v in run.values("heldout_acc")] == [(2, 0.3), (4, 0.5)]
    by_time, by_tokens = heldout_figure([run]).axes[:2]
    (line,) = by_time.get_lines()
    assert list(line.get_xdata()) == [0.0, 4.0, 8.0]  # start, then at the steps' records
    assert list(line.get_ydata()) == [0.1, 0.3, 0.5]
    assert list(by_tokens.get_lines()[0].get_xdata()) == [0.0, 200.0, 400.0]
    assert not by_time.texts  # not "no held-out accuracy recorded"
