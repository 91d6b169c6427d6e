"""Environment steps in worker processes: concurrency, time limits that kill, crashes that end
the episodes they hold (each episode once, with its reason), and a run that goes on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from concurrent.futures import Future

import pytest
import torch

from procs import cwd_of, live_processes
from scripted_env import ByMode
from slipstream.config.env import EnvConfig
from slipstream.engine import Engine, SamplingParams
from slipstream.engine.parking import KVPark
from slipstream.envs import Observation, StepResult
from slipstream.envs.workers import (
    START_FAILURES,
    EnvError,
    ProcessWorkers,
    ThreadWorkers,
    WorkerDied,
    WorkersCannotStart,
)
from slipstream.model.llama import CausalLM, ModelConfig
from slipstream.schedule.episodes import EpisodeRunner, run_episodes
from slipstream.types import Prompt

EOS = 1
# the environment ended it: `max_tokens` when `max_new_tokens` cut its last turn before EOS
BY_ENV = ("done", "max_tokens")


def _engine(slots: int = 4) -> Engine:
    cfg = ModelConfig(
        vocab_size=13, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    engine = Engine(CausalLM(cfg).eval(), EOS, num_slots=slots, max_len=64)
    engine.park = KVPark(1000)
    return engine


def _rows(modes: dict[str, str], sleep_s: float = 0.0) -> list[tuple[Prompt, str, int]]:
    return [
        (Prompt(k, "", None, meta={"mode": m, "sleep_s": sleep_s}), k, n)
        for n, (k, m) in enumerate(modes.items())
    ]


@pytest.mark.slow  # ~9 s here: starts a forkserver (slipstream imported) and 5 workers
def test_process_workers_end_each_episode_once_with_its_reason() -> None:
    """Errors, a timed-out step (its worker SIGKILLed, the episode on it with it: `crash`), an
    externally SIGKILLed worker, and healthy episodes that finish; the run goes on."""
    modes = {"ok0": "ok", "ok1": "ok", "raise": "raise", "hang": "hang", "victim": "slow"}
    cfg = EnvConfig(workers=5, step_timeout_s=1.0, max_turns=4)  # one episode a worker
    params = SamplingParams(temperature=1.0, max_new_tokens=3)
    engine = _engine()
    workers = ProcessWorkers(ByMode, cfg.workers)
    runner = EpisodeRunner(ByMode, params, cfg, 64, on_end=engine.park.discard, workers=workers)

    def kill_victim() -> None:  # SIGKILL the worker of `victim` while its step sleeps
        for _ in range(200):
            i = workers.home.get("victim")
            if i is not None and workers.started("victim") is not None:
                os.kill(workers.workers[i].proc.pid, signal.SIGKILL)
                return
            time.sleep(0.01)

    items = _rows(modes, sleep_s=0.0)
    items[-1][0].meta["sleep_s"] = 0.8
    killer = threading.Thread(target=kill_victim)
    killer.start()
    t0 = time.monotonic()
    try:
        eps = run_episodes(engine, runner, items)
    finally:
        killer.join()
    wall = time.monotonic() - t0
    ends = {e.key: e.stats.end for e in eps}
    assert len(eps) == len(modes) and sorted(ends) == sorted(modes)  # each ended once
    assert ends["ok0"] in BY_ENV and ends["ok1"] in BY_ENV
    assert (
        ends["raise"] == "error"
        and "tool crashed" in next(e for e in eps if e.key == "raise").error
    )
    assert ends["hang"] == "timeout" and ends["victim"] == "crash"
    assert all(e.reward == 0.0 for e in eps if e.stats.end not in BY_ENV)
    assert workers.deaths >= 2 and wall < 10  # the hang was cut at its limit, not after 60 s
    # the run goes on: fresh workers took the dead ones' places
    more = run_episodes(engine, runner, _rows({"again": "ok"}))
    assert len(more) == 1 and more[0].stats.end in BY_ENV
    runner.close()
    workers.close()
    assert all(not w.proc.is_alive() for w in workers.workers)


@pytest.mark.slow  # ~2 s: worker processes
def test_process_workers_step_concurrently() -> None:
    """Eight episodes whose steps each sleep 0.4 s, in 8 processes: the steps overlap."""
    modes = {f"e{i}": "slow" for i in range(8)}
    cfg = EnvConfig(workers=8, step_timeout_s=5.0)
    engine = _engine(slots=8)
    workers = ProcessWorkers(ByMode, cfg.workers)
    run_episodes(engine, EpisodeRunner(ByMode, SamplingParams(0.0, 1.0, 0, 2), cfg, 64,
                                       workers=workers), _rows({"warm": "ok"}))  # fmt: skip
    runner = EpisodeRunner(ByMode, SamplingParams(0.0, 1.0, 0, 2), cfg, 64, workers=workers)
    t0 = time.monotonic()
    eps = run_episodes(engine, runner, _rows(modes, sleep_s=0.4))
    wall = time.monotonic() - t0
    workers.close()
    assert all(e.stats.end in BY_ENV for e in eps)
    assert sum(e.stats.env_time_s for e in eps) >= 8 * 2 * 0.4  # two steps each, in workers
    assert wall < 8 * 2 * 0.4 / 2, wall  # serial would take 6.4 s


def _pump_until_done(workers: ProcessWorkers, future: Future, seconds: float) -> Future:
    """Pump `workers` until `future` resolves or `seconds` pass; returns `future`."""
    deadline = time.monotonic() + seconds
    while not future.done() and time.monotonic() < deadline:
        workers.pump(0.1)
    return future


def test_process_worker_killed_while_idle_fails_the_next_step_instead_of_hanging() -> None:
    """A worker that dies between two steps (nothing running, so nobody is waiting on its
    sentinel) is noticed when the next step is sent: that step fails with `WorkerDied` (before
    the fix the send failed after the step had left the queue, and its future never resolved:
    the hang seen in full suite runs)."""
    workers = ProcessWorkers(ByMode, 1)
    try:
        ((row, key, _),) = _rows({"e": "ok"})
        first = _pump_until_done(workers, workers.first(key, row), 30)
        assert first.done() and first.exception() is None
        proc = workers.workers[0].proc
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        step = _pump_until_done(workers, workers.step(key, [5]), 10)
        assert step.done(), "the step sent to a dead worker never resolved"
        assert isinstance(step.exception(), WorkerDied)
        assert workers.deaths == 1 and workers.workers[0].proc.is_alive()  # replaced
    finally:
        workers.close()


def test_a_row_that_cannot_be_pickled_fails_its_own_episode_only() -> None:
    """A row holding something that does not pickle (a lambda in a column): sending it to a
    worker raised out of `pump`, taking the sampler's loop down. Now that episode fails with
    the reason (EnvError) and the worker goes on with the next."""
    workers = ProcessWorkers(ByMode, 1)
    try:
        ((row, key, _), (good, key2, _)) = _rows({"bad": "ok", "good": "ok"})
        row.meta["f"] = lambda: 0
        bad = _pump_until_done(workers, workers.first(key, row), 30)
        ok = _pump_until_done(workers, workers.first(key2, good), 30)
        assert bad.done() and isinstance(bad.exception(), EnvError)
        assert "cannot send to a worker" in str(bad.exception())
        assert ok.done() and ok.exception() is None and workers.deaths == 0
    finally:
        workers.close()


class _ExitsOnUnpickle:
    """A factory a fresh worker cannot even receive: unpickling it exits the process (as a
    worker does whose main module cannot be imported again)."""

    def __reduce__(self):
        return (os._exit, (1,))


def test_workers_that_exit_at_start_stop_the_run_with_a_clear_error() -> None:
    """Each fresh worker would die the same way: after START_FAILURES in a row the pool raises
    `WorkersCannotStart` naming the fix, instead of failing every episode as `crash` and
    forking replacements for ever."""
    workers = ProcessWorkers(_ExitsOnUnpickle(), 1)  # type: ignore[arg-type]
    try:
        ((row, key, _),) = _rows({"e": "ok"})
        workers.first(key, row)
        deadline = time.monotonic() + 30
        with pytest.raises(
            WorkersCannotStart, match=r'if __name__ == "__main__".*env.isolation="thread"'
        ):
            while time.monotonic() < deadline:
                workers.pump(0.1)
                if not workers.workers[0].running:
                    workers.first((key, time.monotonic()), row)
        assert workers.deaths == START_FAILURES
    finally:
        workers.close()


def test_workers_that_exit_at_start_are_named_so_when_a_timeout_finds_them_first() -> None:
    """A worker that exited by itself, found by the runner's step timeout (`abandon`) before
    the pool read its end: the error names its exit, not a timeout (it said "another
    episode's step timed out", which sent users after the wrong cause)."""
    workers = ProcessWorkers(_ExitsOnUnpickle(), 1)  # type: ignore[arg-type]
    try:
        ((row, key, _),) = _rows({"e": "ok"})
        with pytest.raises(WorkersCannotStart) as err:
            for n in range(START_FAILURES):
                workers.first((key, n), row)
                workers.workers[0].proc.join(30)  # gone by itself
                workers.abandon((key, n))  # as the runner does past env.step_timeout_s
        assert "exit code 1" in str(err.value) and "timed out" not in str(err.value)
    finally:
        workers.close()


def _wait(future: Future, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_thread_workers_a_queued_step_has_not_started() -> None:
    """`started` is None for a step waiting for a free thread: before, it was the time the
    episode's previous operation began, so a step queued behind others looked as if it had
    run since then, and the runner timed it out (ended `timeout`) without it having run."""
    workers = ThreadWorkers(ByMode, 1)
    (a, ka, _), (b, kb, _) = _rows({"a": "ok", "b": "slow"}, sleep_s=0.3)
    try:
        _wait(workers.first(ka, a))
        t_first = workers.started(ka)
        assert t_first is not None
        _wait(workers.first(kb, b))
        busy = workers.step(kb, [5])  # holds the only thread for 0.3 s
        time.sleep(0.05)
        queued = workers.step(ka, [5])
        assert not queued.done() and workers.started(ka) is None
        _wait(queued)
        assert queued.exception() is None and (workers.started(ka) or 0.0) > t_first
        assert busy.done()
    finally:
        workers.close()


def test_thread_workers_an_episode_ended_while_queued_builds_no_environment() -> None:
    """An episode cancelled while its first observation waits for a thread: the queued
    operation does not run later (it built an environment kept for ever, and with a key
    used again, as the sync loop's `(prompt, member)` keys are, replaced the new one's)."""
    workers = ThreadWorkers(ByMode, 1)
    (a, ka, _), (c, kc, _) = _rows({"a": "slow", "c": "ok"}, sleep_s=0.2)
    try:
        _wait(workers.first(ka, a))
        busy = workers.step(ka, [5])
        queued = workers.first(kc, c)
        workers.end(kc)  # cancelled before a thread was free
        _wait(busy)
        _wait(queued, 2.0)
        assert kc not in workers.envs and ka in workers.envs
        assert queued.cancelled()
    finally:
        workers.close()


@pytest.mark.slow  # ~15 s on the loaded 2-core machine: a forkserver and one worker
def test_process_workers_drop_the_queued_operations_of_an_ended_episode() -> None:
    """An episode that ends (cancelled) while its operation is queued behind another's: the
    operation leaves the queue (before, it still ran: a first observation built an
    environment the worker kept for ever, after its drop, and held up live episodes)."""
    workers = ProcessWorkers(ByMode, 1)
    (a, ka, _), (c, kc, _) = _rows({"a": "slow", "c": "ok"}, sleep_s=0.3)
    try:
        assert _pump_until_done(workers, workers.first(ka, a), 30).exception() is None
        busy = workers.step(ka, [5])
        queued = workers.first(kc, c)
        workers.end(kc)
        assert _pump_until_done(workers, busy, 10).exception() is None
        w = workers.workers[0]
        assert not w.running and not w.queue  # nothing sent after the step
        assert queued.cancelled()
    finally:
        workers.close()


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (an orphan nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow  # ~15 s on the loaded 2-core machine: a forkserver and one worker
def test_a_worker_in_the_middle_of_a_step_exits_when_its_parent_dies() -> None:
    """The workers are children of the sampler's fork server, which exits when the sampler
    dies; a worker then exited only at its next read of the pipe, so one inside a hung step
    ran on for ever (nobody left to enforce its time limit)."""
    import multiprocessing.forkserver as mpf

    workers = ProcessWorkers(ByMode, 1)
    try:
        ((row, key, _),) = _rows({"e": "hang"})
        assert _pump_until_done(workers, workers.first(key, row), 30).exception() is None
        workers.step(key, [5])  # sleeps 60 s
        pid = workers.workers[0].proc.pid
        assert workers.started(key) is not None and _running(pid)
        os.kill(mpf._forkserver._forkserver_pid, signal.SIGKILL)  # as when the sampler dies
        deadline = time.monotonic() + 10
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(pid), "the worker outlived its parent"
    finally:
        for w in workers.workers:  # (the pool cannot replace it: its fork server is gone)
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.proc.pid, signal.SIGKILL)
        workers.close()  # (its workers' temporary folders)


def test_thread_workers_replace_the_thread_of_an_abandoned_step() -> None:
    """A step past its limit is abandoned in its thread, which runs on: the others still get
    `n` threads (before, each hung step held one of the pool's for good, and once `n` hung every
    later step stayed queued, never started, so never timed out: the run stalled)."""
    workers = ThreadWorkers(ByMode, 1)
    (h, kh, _), (a, ka, _) = _rows({"h": "slow", "a": "ok"})
    h.meta["sleep_s"] = 2.0
    try:
        _wait(workers.first(kh, h))
        _wait(workers.first(ka, a))
        stuck = workers.step(kh, [5])  # 2 s in the only thread
        time.sleep(0.05)
        workers.abandon(kh)  # (as the runner does past env.step_timeout_s)
        step = workers.step(ka, [5])
        _wait(step, 1.0)
        assert step.done() and step.exception() is None and not stuck.done()
    finally:
        workers.close()


@pytest.mark.slow  # ~15 s on the loaded 2-core machine: a forkserver and one worker
def test_a_first_observation_queued_on_a_killed_worker_runs_on_its_replacement() -> None:
    """A worker killed for one episode's timeout: an episode whose first observation was
    only queued there had no environment to lose, and starts on the fresh worker (before, it
    ended `crash` too, without having run)."""
    workers = ProcessWorkers(ByMode, 1)
    (h, kh, _), (b, kb, _) = _rows({"h": "hang", "b": "ok"})
    try:
        assert _pump_until_done(workers, workers.first(kh, h), 30).exception() is None
        workers.step(kh, [5])  # hangs
        queued = workers.first(kb, b)
        workers.pump(0.1)
        assert workers.started(kh) is not None and not queued.done()
        workers.abandon(kh)  # (as the runner does past env.step_timeout_s)
        assert _pump_until_done(workers, queued, 30).exception() is None
        assert workers.deaths == 1 and kb not in workers.lost
        step = _pump_until_done(workers, workers.step(kb, [5]), 10)
        assert step.exception() is None
    finally:
        workers.close()


class _Blocks:
    """An async environment whose step blocks its thread for `sleep_s` (`time.sleep`, a sync
    client inside a coroutine); it checks that its loop, and the task it started in its first
    observation, are still there."""

    def __init__(self, row: Prompt) -> None:
        self.sleep_s = float(row.meta.get("sleep_s", 0.0))

    async def initial_observation(self) -> Observation:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.create_task(asyncio.sleep(0, result=1.0))
        return Observation([2, 3])

    async def step(self, action_tokens: list[int]) -> StepResult:
        assert asyncio.get_running_loop() is self.loop
        time.sleep(self.sleep_s)
        return StepResult(await self.task, True)


def test_thread_workers_an_async_step_that_blocks_stalls_no_other_environment() -> None:
    """Two async environments in thread workers; one's step blocks for 0.7 s: the other's step
    finishes at once (before, every async environment of the process ran on one event loop,
    so it waited for the blocking call: a step of a healthy episode could time out because
    of another's). Each environment's loop is closed when its episode ends."""
    workers = ThreadWorkers(_Blocks, 2)
    (b, kb, _), (a, ka, _) = _rows({"blocks": "ok", "a": "ok"})
    b.meta["sleep_s"] = 0.7
    try:
        _wait(workers.first(kb, b))
        _wait(workers.first(ka, a))
        blocked = workers.step(kb, [5])
        time.sleep(0.05)
        step = workers.step(ka, [5])
        _wait(step, 0.3)
        assert step.done() and not blocked.done(), "it waited for the other's blocking call"
        assert step.result()[0] == StepResult(1.0, True)
        _wait(blocked, 2.0)
        assert blocked.result()[0] == StepResult(1.0, True)
        loops = [workers.loops[k] for k in (ka, kb)]
        workers.end(ka)
        workers.end(kb)
        assert not workers.loops and all(loop.closed(timeout=1.0) for loop in loops)
    finally:
        workers.close()


class _Awaits:
    """An async environment whose step awaits for a minute."""

    def __init__(self, row: Prompt) -> None:
        pass

    async def initial_observation(self) -> Observation:
        return Observation([2, 3])

    async def step(self, action_tokens: list[int]) -> StepResult:
        await asyncio.sleep(60)
        return StepResult(1.0, True)


def test_thread_workers_an_abandoned_async_step_is_cancelled_with_its_loop() -> None:
    """A step past its limit, awaiting: abandoning it closes its environment's loop, which
    cancels it, and its thread ends (before, it awaited on the process's shared loop for as
    long as it would, its thread waiting with it)."""
    workers = ThreadWorkers(_Awaits, 1)
    ((row, key, _),) = _rows({"e": "ok"})
    before = _loop_threads()
    try:
        _wait(workers.first(key, row))
        step = workers.step(key, [5])
        time.sleep(0.05)
        workers.abandon(key)  # (as the runner does past env.step_timeout_s)
        _wait(step, 1.0)
        assert step.done() and "CancelledError" in str(step.exception())
        deadline = time.monotonic() + 1.0
        while _loop_threads() > before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _loop_threads() == before, "its loop's thread runs on"
    finally:
        workers.close()


def _loop_threads() -> int:
    return sum(t.name == "slipstream-env-loop" for t in threading.enumerate())


def test_a_thread_step_that_raises_a_base_exception_is_an_error() -> None:
    """A step ending in `SystemExit` (a tool calling `sys.exit()`): its future fails with
    `EnvError` (the episode ends `error`); before, the exception escaped the thread, the
    future never resolved, and the episode waited for its time limit (`timeout`)."""
    import sys as _sys

    class Exits(ByMode):
        def step(self, action_tokens: list[int]) -> StepResult:
            _sys.exit(3)

    workers = ThreadWorkers(Exits, 1)
    ((row, key, _),) = _rows({"e": "ok"})
    try:
        _wait(workers.first(key, row))
        step = workers.step(key, [5])
        _wait(step, 2.0)
        assert step.done() and isinstance(step.exception(), EnvError)
        assert "SystemExit" in str(step.exception())
    finally:
        workers.close()


@pytest.mark.slow  # a few seconds: a forkserver and one worker
def test_a_process_step_that_exits_is_an_error_and_its_worker_lives() -> None:
    """An environment whose step raises `SystemExit`: the episode ends `error` with it and
    the worker goes on (before, the worker process exited, ending every episode whose
    environment it held as `crash`)."""
    workers = ProcessWorkers(ByMode, 1)
    (x, kx, _), (a, ka, _) = _rows({"x": "exit", "a": "ok"})
    try:
        assert _pump_until_done(workers, workers.first(kx, x), 30).exception() is None
        assert _pump_until_done(workers, workers.first(ka, a), 10).exception() is None
        err = _pump_until_done(workers, workers.step(kx, [5]), 10).exception()
        assert isinstance(err, EnvError) and "SystemExit" in str(err)
        assert _pump_until_done(workers, workers.step(ka, [5]), 10).exception() is None
        assert workers.deaths == 0
    finally:
        workers.close()


def _child_cwd(pid: int) -> str | None:
    """The working directory of a live child of process `pid` (None: it has none)."""
    return next((cwd_of(c) for c, f in live_processes() if int(f[1]) == pid), None)


@pytest.mark.slow  # ~15 s on the loaded 2-core machine: a forkserver and two workers in turn
def test_a_worker_killed_in_a_sandbox_call_leaves_no_temporary_folder() -> None:
    """A worker SIGKILLed for its step's time limit in the middle of a `python` call: the
    sandbox's working directory, removed by a `finally` that never ran, was left in the
    temporary folder, one more at each such timeout. Each worker's temporary files are now in
    a folder of its own, removed when it is replaced (and at close)."""
    workers = ProcessWorkers(ByMode, 1)
    try:
        ((row, key, _),) = _rows({"s": "sandbox"})
        assert _pump_until_done(workers, workers.first(key, row), 30).exception() is None
        step = workers.step(key, [5])
        pid, work, deadline = workers.workers[0].proc.pid, None, time.monotonic() + 30
        while work is None and time.monotonic() < deadline:
            workers.pump(0.05)
            work = _child_cwd(pid)
        assert work is not None and "slipstream-sandbox-" in work, "the sandbox never started"
        workers.abandon(key)  # as the runner does past env.step_timeout_s
        assert isinstance(step.exception(timeout=1), WorkerDied)
        assert not os.path.exists(work), f"{work} was left behind"
        fresh = workers.workers[0].scratch
        assert os.path.isdir(fresh)
    finally:
        workers.close()
    assert not os.path.exists(fresh)  # the replacement's folder, at close


def _oldest_first(workers: ThreadWorkers | ProcessWorkers, wait) -> list[str]:
    """Episodes a (slow), b and c started in that order; while a's step holds the only
    worker, d starts, then c and b step: the queued operations run oldest episode first (b,
    c, then d's first observation), not in the order they were asked (d, c, b)."""
    rows = _rows({"a": "slow", "b": "ok", "c": "ok", "d": "ok"}, sleep_s=0.3)
    (a, ka, _), (b, kb, _), (c, kc, _), (d, kd, _) = rows
    for row, key in ((a, ka), (b, kb), (c, kc)):
        wait(workers.first(key, row))
    busy = workers.step(ka, [5])  # holds the only worker for 0.3 s
    order: list[str] = []
    queued = [workers.first(kd, d), workers.step(kc, [5]), workers.step(kb, [5])]
    for key, f in zip((kd, kc, kb), queued, strict=True):
        f.add_done_callback(lambda _, key=key: order.append(key))
    for f in [busy, *queued]:
        wait(f)
    assert all(f.exception() is None for f in queued)
    return order


def test_thread_workers_run_the_oldest_episode_first() -> None:
    workers = ThreadWorkers(ByMode, 1)
    try:
        assert _oldest_first(workers, _wait) == ["b", "c", "d"]
    finally:
        workers.close()


@pytest.mark.slow  # a few seconds: a forkserver and one worker
def test_process_workers_run_the_oldest_episode_first() -> None:
    workers = ProcessWorkers(ByMode, 1)
    try:
        assert _oldest_first(workers, lambda f: _pump_until_done(workers, f, 30)) == ["b", "c", "d"]
    finally:
        workers.close()
