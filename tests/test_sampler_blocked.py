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
    rec = stats.record([], [], {}, lag, 0.0, 0.0)
    assert rec["runtime/sampler_blocked"] > rec["runtime/sampler_busy"] > 0
    assert rec["runtime/sampler_busy"] + rec["runtime/sampler_blocked"] <= 1.0 + 1e-9
    # goodput's useful time is the generating time only
    good = goodput([{**rec, "tokens/generated": 10}], total, samplers=1)
    assert abs(good["useful_s"] - r.busy_s) < 1e-6


def test_a_report_sent_inside_a_spell_is_as_of_the_time_accounted():
    """A group finishing in an engine step is sent before that step's spell is accounted; its
    report carries the time up to which its counters are accounted, so the busy seconds
    between two reports never exceed the seconds between them (a step's `sampler_busy` was
    over 1 on about one pipeline step in six, up to 1.10, when the report carried its send
    time)."""
    w = _worker()
    ch = SimpleNamespace(groups=FullQueue(0.0), stop=SimpleNamespace(is_set=lambda: False))
    t0 = time.perf_counter()
    time.sleep(0.02)
    w._account("wait", t0)  # idle until a prompt came
    t1 = time.perf_counter()
    time.sleep(0.05)  # an engine step: a group finishes inside it
    w._send(ch, SamplerMessage("group", 0))
    time.sleep(0.05)
    w._account("generate", t1)  # the step ends
    w._send(ch, SamplerMessage("stats", 0))
    first, second = (m.report for m in ch.groups.got)
    assert first.busy_s == 0.0 and second.busy_s > 0.09
    assert second.busy_s - first.busy_s <= second.t - first.t + 1e-9
    stats = StepStats()
    stats.add_report(first)
    stats.start()
    stats.add_report(second)
    rec = stats.record([], [], {}, {"lag_mean": 0.0, "lag_max": 0, "lag_hist": []}, 0.0, 0.0)
    assert 0.9 < rec["runtime/sampler_busy"] <= 1.0 + 1e-9


class Queue(ChannelEnd):
    def __init__(self, room: bool) -> None:
        self.room, self.got = room, []

    def put(self, msg, timeout):
        if self.room:
            self.got.append(msg)
        return self.room


def test_a_group_taken_into_the_engine_is_reported_started_before_its_forward_pass():
    """`started` was sent only after the engine step that took the group in: a prompt that
    kills its sampler in that step was taken for not started, and re-sent as it was for ever,
    never counted toward runtime.max_request_retries."""
    from slipstream.engine import Request, SamplingParams

    for room in (True, False):
        w = _worker()
        w.runner = None
        w.channels = SimpleNamespace(groups=Queue(room), stop=SimpleNamespace(is_set=lambda: False))
        p = SamplingParams(1.0, max_new_tokens=4)
        w.state.backlog.extend(Request([1, 2], p, seed=s, key=(7, s)) for s in range(2))
        t0 = time.perf_counter()
        assert len(w._refill(2)) == 2
        assert time.perf_counter() - t0 < 1.0  # a full queue does not hold the step (a held
        # one never returns: the fake queue stays full); 1 s, not less, for a loaded machine
        sent = w.channels.groups.got
        assert w.state.report.started == 1
        if room:
            assert [(m.kind, m.report.started) for m in sent] == [("stats", 1)]
            assert w.state.started_reported == 1
        else:  # nothing sent: the report after the step says it (`_report_due`)
            assert sent == [] and w.state.started_reported == 0
