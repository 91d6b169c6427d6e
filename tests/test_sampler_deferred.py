"""Requests the engine took from the sampler's backlog but did not admit yet (`defer_prefill`,
on by default with CUDA graphs: free slots wait until the idle decode capacity pays for a
prefill) are the sampler's work too. The loop used to read `engine.num_active == 0` as "no
work": once the live slots finished, a request deferred in the engine's waiting line was never
stepped (the sampler waited for prompts that the orchestrator held back for that very group),
and a weight load then stepped the engine "empty" (`assert not engine.step()`), admitting the
deferred request and failing on its completion."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from slipstream.engine import Completion, Engine, Request, SamplingParams
from slipstream.engine.admission import PrefillAdmission
from slipstream.model.llama import CausalLM
from slipstream.runtime.channels import SamplerReport
from slipstream.schedule.sampler import SamplerState, SamplerWorker
from test_engine import _model  # a tiny random Llama

pytestmark = pytest.mark.usefixtures("one_thread")


def _worker(engine: Engine) -> tuple[SamplerWorker, list[Completion]]:
    """The loop around a real engine; finished requests are collected, not scored."""
    w = SamplerWorker.__new__(SamplerWorker)
    w.id, w.poll_s, w.lag_policy, w.state = 0, 0.01, "keep", SamplerState()
    w.runner, w.log = None, None
    now = time.perf_counter()
    w.state.report = SamplerReport(0, now, now)
    w.state.t_last_report = now
    w.spec = SimpleNamespace(  # type: ignore[assignment]
        schedule=SimpleNamespace(batching="continuous", weight_sync="in_flight", max_lag=4),
        cfg=SimpleNamespace(runtime=SimpleNamespace(startup_timeout_s=1.0)),
    )
    w.engine = engine
    engine.refill = w._refill
    done: list[Completion] = []
    w._finished = lambda ch, c: done.append(c)  # type: ignore[method-assign]
    return w, done


def _channels(weights: SimpleNamespace, waits: int = 5) -> SimpleNamespace:
    """No prompts ever arrive; the loop stops after `waits` waits for them."""
    stop, asked = threading.Event(), []

    def get(timeout: float) -> None:
        asked.append(1)
        if len(asked) >= waits:
            stop.set()
        return None

    groups = SimpleNamespace(put=lambda msg, timeout: True, push=lambda force=True: None)
    return SimpleNamespace(
        stop=stop, prompts=SimpleNamespace(get=get), weights=weights, groups=groups
    )


def _deferring_engine(model: CausalLM) -> Engine:
    engine = Engine(model, 99, num_slots=2, max_len=24, decode_graph=True, defer_prefill=True)
    engine.admission = PrefillAdmission(decode_s=1.0, prefill_s=100.0)  # never due while decoding
    return engine


def _request(group: int, n: int) -> Request:
    return Request([3, 4, 5], SamplingParams(0.0, max_new_tokens=n), key=(group, 0))


def test_a_request_deferred_in_the_engine_is_generated_once_the_slots_empty():
    engine = _deferring_engine(_model())
    w, done = _worker(engine)
    # two slots: the 2-token request frees one, the third request is taken into the engine's
    # waiting line and deferred while the 5-token one decodes, which then finishes too
    w.state.backlog.extend([_request(0, 2), _request(1, 5), _request(2, 3)])
    same = SimpleNamespace(version=lambda: engine.version)
    w._loop(_channels(same))  # type: ignore[arg-type]
    assert sorted(len(c.tokens) for c in done) == [2, 3, 5]
    assert engine.idle()


def test_weights_loaded_while_a_deferred_request_waits_apply_at_its_first_token():
    model = _model()
    engine = _deferring_engine(model)
    w, done = _worker(engine)
    engine.add(_request(0, 1))  # deferred earlier: no slot live, one request waiting
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    weights = SimpleNamespace(
        version=lambda: 1, read=lambda newer_than, timeout: (state, 1) if newer_than < 1 else None
    )
    w._loop(_channels(weights))  # type: ignore[arg-type]
    assert [c.versions for c in done] == [[1]]
    assert engine.idle() and engine.version == 1


def test_cancelling_a_group_drops_its_members_deferred_in_the_engine():
    """A redundant member cancelled (or a stale group aborted) while it waits in the engine
    was generated whole afterwards and its tokens counted as cancelled."""
    engine = _deferring_engine(_model())
    w, done = _worker(engine)
    engine.add(Request([3, 4, 5], SamplingParams(0.0, max_new_tokens=4), key=(5, 1)))
    engine.add(_request(6, 2))  # another group's member stays
    assert w._cancel(5) == 0
    assert [r.key for r in engine.waiting] == [(6, 0)]
    w._loop(_channels(SimpleNamespace(version=lambda: engine.version)))  # type: ignore[arg-type]
    assert [c.request.key for c in done] == [(6, 0)]


def test_episode_turns_take_the_slots_oldest_group_first():
    """Turns of episodes join the backlog as their environments answer, in any order; the
    sampler keeps the backlog in group order (group ids are issued in admission order), so
    with one slot the engine runs the oldest group's turn first. (They used to join at the
    front, newest answer first: (5, 0) would have run first here and (2, 0) last.)"""
    engine = Engine(_model(), 99, num_slots=1, max_len=24)
    w, _ = _worker(engine)
    w.state.backlog.append(_request(2, 2))  # a turn an earlier poll queued
    polls = [([_request(5, 2), _request(1, 2), _request(3, 2)], [])]
    w.runner = SimpleNamespace(poll=lambda: polls.pop(0))  # type: ignore[assignment]
    w._poll_episodes(None)  # type: ignore[arg-type]
    assert [r.key for r in w.state.backlog] == [(1, 0), (2, 0), (3, 0), (5, 0)]
    order = []
    while w.state.backlog or not engine.idle():
        order += [c.request.key for c in engine.step()]
    assert order == [(1, 0), (2, 0), (3, 0), (5, 0)]
