"""A sampler blocked on a full group queue is not generating: the spell is its own timeline
state (`blocked`), outside `busy_s` (so `sampler_busy` and goodput's useful time), and counted
in `blocked_s` (`runtime/sampler_blocked`)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from slipstream.engine.stats import EngineStats
from slipstream.observe.timeline import Interval, busy_fraction
from slipstream.runtime.channels import ChannelEnd, SamplerMessage, SamplerReport
from slipstream.schedule.sampler import SamplerState, SamplerWorker
from slipstream.schedule.step_stats import StepStats, goodput


class FullQueue(ChannelEnd):
    """Refuses puts for `full_s` seconds from the first (the trainer is not taking groups),
    then takes them."""

    def __init__(self, full_s: float) -> None:
        self.full_s, self.until, self.got = full_s, None, []

    def put(self, msg, timeout):
        if self.until is None:
            self.until = time.perf_counter() + self.full_s
        if time.perf_counter() < self.until:
            time.sleep(min(timeout, max(self.until - time.perf_counter(), 0.0)))
            if time.perf_counter() < self.until:
                return False
        self.got.append(msg)
        return True


def _worker() -> SamplerWorker:
    w = SamplerWorker.__new__(SamplerWorker)  # the reporting half only: no engine, no model
    w.id, w.poll_s, w.state = 0, 0.01, SamplerState()
    w.state.report = SamplerReport(0, 0.0, 0.0)
    w.engine = SimpleNamespace(stats=EngineStats())  # type: ignore[assignment]
    return w


def test_time_blocked_on_a_full_group_queue_is_its_own_state_not_busy():
    w = _worker()
    ch = SimpleNamespace(groups=FullQueue(0.15), stop=SimpleNamespace(is_set=lambda: False))
    t0 = time.perf_counter()
    time.sleep(0.05)  # generating
    w._send(ch, SamplerMessage("group", 0))  # a finished group: blocked for ~0.15 s
    time.sleep(0.05)  # generating again
    w._account("generate", t0)
    w._account("wait", time.perf_counter())  # closes the open interval
    r = w.state.report
    kinds = [k for k, *_ in r.intervals]
    assert kinds == ["generate", "blocked", "generate"], r.intervals
    total = r.intervals[-1][2] - r.intervals[0][1]
    assert 0.12 < r.blocked_s < 0.25 and abs(r.busy_s + r.blocked_s - total) < 1e-6
    assert ch.groups.got and len(ch.groups.got) == 1

    spans = [Interval("sampler0", k, a, b) for k, a, b in r.intervals]
    assert busy_fraction(spans, "sampler0", spans[0].t0, spans[-1].t1) < 0.5
    stats = StepStats()
    stats.add_report(SamplerReport(0, 0.0, 0.0))
    stats.start()
    stats.add_report(SamplerReport(0, total, 0.0, busy_s=r.busy_s, blocked_s=r.blocked_s))
    lag = {"lag_mean": 0.0, "lag_max": 0, "lag_hist": []}
    rec = stats.record([], {}, lag, 0.0, 0.0)
    assert rec["runtime/sampler_blocked"] > rec["runtime/sampler_busy"] > 0
    assert rec["runtime/sampler_busy"] + rec["runtime/sampler_blocked"] <= 1.0 + 1e-9
    # goodput's useful time is the generating time only
    good = goodput([{**rec, "tokens/generated": 10}], total, samplers=1)
    assert abs(good["useful_s"] - r.busy_s) < 1e-6
