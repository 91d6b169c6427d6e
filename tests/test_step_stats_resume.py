"""A resumed run's summary covers the whole run: `StepStats.state_dict` carries the run-level
sums over a resume, and the second segment's `summary` goes on from them."""

from __future__ import annotations

import json

import pytest

from slipstream.runtime.channels import SamplerReport
from slipstream.schedule.step_stats import StepStats

# per step: (lag mean, lag max, trained tokens), (ESS token, ESS seq), trainer wait (s)
STEPS = [
    ((0.5, 1, 100), (0.99, 0.97), 0.2),
    ((1.5, 3, 300), (0.90, 0.80), 0.1),
    ((1.0, 2, 200), (0.95, 0.92), 0.4),
    ((2.0, 2, 100), (0.85, 0.70), 0.3),
]


def _segment(stats: StepStats, steps: list, busy: float, span: float, tokens: int) -> None:
    """Steps trained, a sampler's reports spanning `span` s with `busy` s generating, and one
    restart (as `record` and the orchestrator leave the fields)."""
    stats.add_report(SamplerReport(0, 100.0, 0.0))
    stats.start()
    for lag, ess, wait in steps:
        stats.lags.append(lag)
        stats.ess.append(ess)
        stats.wait_total += wait
    stats.add_report(
        SamplerReport(0, 100.0 + span, 0.0, busy_s=busy, blocked_s=0.1, tokens_generated=tokens)
    )
    stats.restarts += 1


def test_two_segments_resumed_give_the_whole_runs_summary() -> None:
    first = StepStats()
    _segment(first, STEPS[:2], busy=3.0, span=4.0, tokens=500)
    saved = json.loads(json.dumps(first.state_dict()))  # through state.json
    second = StepStats()
    second.load_state_dict(saved)
    _segment(second, STEPS[2:], busy=1.0, span=4.0, tokens=300)
    second.t_start, second.t_end = 0.0, 10.0  # the resumed clock spans the whole run
    s = second.summary()
    # hand-derived from STEPS and the two segments
    assert s["lag_mean"] == pytest.approx((50 + 450 + 200 + 200) / 700)
    assert s["lag_max"] == 3
    assert s["ess_token"] == pytest.approx((0.99 + 0.90 + 0.95 + 0.85) / 4)
    assert s["ess_seq"] == pytest.approx((0.97 + 0.80 + 0.92 + 0.70) / 4)
    assert s["trainer_wait"] == pytest.approx(1.0 / 10.0)
    assert s["sampler_busy"] == pytest.approx(4.0 / 8.0)
    assert s["sampler_blocked"] == pytest.approx(0.2 / 8.0)
    assert (s["tokens_generated"], s["busy_s"], s["sampler_restarts"]) == (800, 4.0, 2)


def test_a_checkpoint_without_run_stats_resumes_with_this_segment_only() -> None:
    stats = StepStats()
    stats.load_state_dict({})
    _segment(stats, STEPS[2:], busy=1.0, span=4.0, tokens=300)
    s = stats.summary()
    assert s["lag_mean"] == pytest.approx(400 / 300) and s["lag_max"] == 2
    assert s["sampler_restarts"] == 1 and s["tokens_generated"] == 300
