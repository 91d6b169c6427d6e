"""A step still running when its episode ends (`EpisodeRunner.cancel`: a stale group aborted, a
redundant member cancelled) keeps `env.step_timeout_s`: past it, its thread stops counting
among the workers' `n` (thread workers) or its worker is killed and replaced (process workers).
Before, nothing timed it once its episode had ended, and a step that hung held its thread or
its worker for ever, and every episode queued behind it with it."""

from __future__ import annotations

import time

import pytest

from scripted_env import ByMode
from slipstream.config.env import EnvConfig
from slipstream.engine import Completion, SamplingParams
from slipstream.envs.workers import ProcessWorkers, ThreadWorkers
from slipstream.schedule.episodes import EpisodeRunner
from slipstream.types import FinishReason
from test_envs_workers import _pump_until_done, _rows, _wait


def test_thread_workers_free_the_thread_of_an_ended_episode_s_step_past_the_limit() -> None:
    workers = ThreadWorkers(ByMode, 1)
    (a, ka, _), (b, kb, _) = _rows({"a": "hang", "b": "ok"})
    try:
        _wait(workers.first(ka, a))
        workers.step(ka, [5])  # sleeps 60 s in the only thread
        time.sleep(0.05)
        workers.end(ka)  # its episode is cancelled mid-step
        queued = workers.first(kb, b)
        workers.overdue(0.4)  # not yet past the limit: the thread is still the hung step's
        time.sleep(0.1)
        assert not queued.done()
        time.sleep(0.4)
        workers.overdue(0.4)
        _wait(queued, 2.0)
        assert queued.done() and queued.exception() is None
    finally:
        workers.close()


def test_a_runner_times_the_step_of_an_episode_it_cancelled() -> None:
    """Through `EpisodeRunner`: episode a's step hangs, a is cancelled, b's first observation
    waits for the only thread; `poll` frees it once a's step is past `env.step_timeout_s`."""
    cfg = EnvConfig(workers=1, isolation="thread", step_timeout_s=0.3, max_turns=4)
    params = SamplingParams(temperature=1.0, max_new_tokens=3)
    runner = EpisodeRunner(ByMode, params, cfg, max_len=64)
    (a, ka, _), (b, kb, _) = _rows({"a": "hang", "b": "ok"})
    try:
        runner.start(a, ka, 0)
        requests: list = []
        deadline = time.monotonic() + 5.0
        while not requests and time.monotonic() < deadline:
            runner.wait(0.05)
            requests = runner.poll()[0]
        (r,) = requests
        runner.turn(Completion(r, [7], [0.0], [0], FinishReason.STOP, 0, 0))  # its step hangs
        time.sleep(0.05)
        assert [e.stats.end for e in runner.cancel(lambda k: k == ka)] == ["aborted"]
        runner.start(b, kb, 1)
        t0, got = time.monotonic(), []
        while not got and time.monotonic() - t0 < 3.0:
            runner.wait(0.05)
            got = runner.poll()[0]
        assert [q.key for q in got] == [kb], "b's first observation waited for the hung step"
        assert time.monotonic() - t0 >= 0.2  # (after a's step passed its limit, not before)
    finally:
        runner.close()


@pytest.mark.slow  # ~10 s on the loaded 2-core machine: a forkserver and two workers in turn
def test_process_workers_kill_the_worker_of_an_ended_episode_s_step_past_the_limit() -> None:
    workers = ProcessWorkers(ByMode, 1)
    (a, ka, _), (b, kb, _) = _rows({"a": "hang", "b": "ok"})
    try:
        assert _pump_until_done(workers, workers.first(ka, a), 60).exception() is None
        hung = workers.step(ka, [5])  # sleeps 60 s in the only worker
        time.sleep(0.2)
        workers.end(ka)  # its episode is cancelled mid-step
        queued = workers.first(kb, b)
        workers.pump(0.1)
        workers.overdue(30.0)  # not past the limit: nothing killed
        assert workers.deaths == 0 and not queued.done()
        workers.overdue(0.25)
        assert workers.deaths == 1 and "an ended episode's step ran past" in str(hung.exception())
        # b's first observation, queued there, went to the fresh worker (nothing of it lost)
        assert _pump_until_done(workers, queued, 60).exception() is None
    finally:
        workers.close()
