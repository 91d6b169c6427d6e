"""The token-level environment protocol: one `Env` per sample, built by a factory from its row.

An episode is: the prompt is `initial_observation().tokens`; the model generates a turn (up to
its end-of-sequence token, or a budget); `step(action_tokens)` gets that turn's tokens (a
`types.TurnTokens` list, whose `trainer_state` is the `TrainerState` the turn ended at) and
returns a `StepResult`; unless `done`, `next_observation.tokens` are appended to the sequence
as environment tokens and the model generates the next turn. Token in, token out: the
sequence is never re-tokenized, so what is trained is exactly what the model saw.

Either method may be a coroutine function (`async def`): it is run to completion in the
environment worker that runs the step (envs.workers), never in the engine's loop, on an event
loop kept across calls, so an environment may hold what it started (tasks, subprocesses,
clients) from one step to the next. In a worker process (`env.isolation="process"`, one step at
a time) that is the process's loop; in thread workers, and in a worker process running several
steps at once (`env.worker_concurrency` > 1: thread workers inside it), each environment has a
loop of its own (`EnvLoop`: a thread of its own, started at its first await, closed when its
episode ends), so a call that blocks inside one environment's coroutine (`time.sleep`, a sync
client) stalls no other. The episode's reward is the sum of its steps' rewards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import inspect
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from slipstream.types import Prompt

T = TypeVar("T")


@dataclass
class Observation:
    """Tokens the environment appends to the sequence (never trained); `text` for logs."""

    tokens: list[int]
    text: str = ""


@dataclass
class StepResult:
    """What one environment step returns. `next_observation` is needed unless `done`.

    `metrics` are per-step numbers summed over the episode; the keys `tool_calls` and
    `tool_errors` feed the episode's counts (types.EpisodeStats).
    """

    reward: float = 0.0
    done: bool = False
    next_observation: Observation | None = None
    metrics: dict[str, float] = field(default_factory=dict)


class Env(Protocol):
    """A multi-turn environment; sync or async methods (see the module docstring)."""

    def initial_observation(self) -> Observation | Awaitable[Observation]: ...

    def step(self, action_tokens: list[int]) -> StepResult | Awaitable[StepResult]: ...


EnvFactory = Callable[[Prompt], Env]
"""Builds a fresh environment for one sample from its dataset row."""


def resolve(value: T | Awaitable[T]) -> T:
    """`value`, or the result of running it to completion if it is awaitable (an async env).

    Runs it on the environments' event loop of this thread (`using_loop`: an environment's
    own in thread workers), else of this process (in a thread of its own, kept for the
    process's life: what one call starts is there at the next); blocks until it is done, so
    call it from an environment worker, never from a coroutine on that loop.
    """
    if not inspect.isawaitable(value):
        return value
    own = getattr(_CURRENT, "loop", None)
    try:
        loop = own.get() if own is not None else _env_loop()
        if _running_loop() is loop:  # it would wait for itself for ever
            raise TypeError("resolve() called on the environments' event loop: await it instead")
    except (TypeError, RuntimeError):  # (RuntimeError: an ended environment's loop)
        if inspect.iscoroutine(value):
            value.close()  # never awaited: no warning of it
        raise

    async def _await() -> T:
        return await value

    if own is not None:
        return own.submit(_await()).result()
    return asyncio.run_coroutine_threadsafe(_await(), loop).result()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # none runs in this thread
        return None


_LOOP: tuple[int, asyncio.AbstractEventLoop] | None = None  # (the pid it runs in, the loop)
_LOOP_LOCK = threading.Lock()


def _env_loop() -> asyncio.AbstractEventLoop:
    """The environments' event loop of this process, started on first use (again after a
    fork, which keeps no threads)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=loop.run_forever, name="slipstream-env-loop", daemon=True
            ).start()
            _LOOP = (os.getpid(), loop)
        return _LOOP[1]


_CURRENT = threading.local()  # .loop: the EnvLoop `resolve` runs on in this thread (if set)


@contextlib.contextmanager
def using_loop(loop: EnvLoop) -> Iterator[None]:
    """Meanwhile `resolve` in this thread runs awaitables on `loop` (thread workers set an
    environment's own around each of its operations)."""
    before = getattr(_CURRENT, "loop", None)
    _CURRENT.loop = loop
    try:
        yield
    finally:
        _CURRENT.loop = before


class EnvLoop:
    """An event loop in a daemon thread of its own, started at the first `get()` (a sync
    environment never starts one) and kept until `close()`: one environment's, in thread
    workers (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closing = False

    def get(self) -> asyncio.AbstractEventLoop:
        """The running loop (started now if need be); RuntimeError once closed."""
        with self._lock:
            if self._closing:
                raise RuntimeError("the environment's event loop is closed (its episode ended)")
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=_serve, args=(self._loop, self), name="slipstream-env-loop", daemon=True
                )
                self._thread.start()
            return self._loop

    def submit(self, coro: Coroutine[object, object, T]) -> cf.Future[T]:
        """`coro` scheduled on the loop (RuntimeError once closed): under the lock `close`
        takes, so whatever was submitted before it is cancelled by it, never left waiting."""
        with self._lock:
            if self._closing:
                coro.close()
                raise RuntimeError("the environment's event loop is closed (its episode ended)")
            loop = self._loop
            assert loop is not None, "get() starts the loop"
            return asyncio.run_coroutine_threadsafe(coro, loop)

    def close(self) -> None:
        """Cancel its tasks (a call awaiting on it raises CancelledError), stop the loop and
        close it, in its thread; returns at once (a call blocking the loop delays it)."""
        with self._lock:
            if self._closing or self._loop is None:
                self._closing = True
                return
            self._closing = True
            shutdown = _shutdown(self._loop)
            self._loop.call_soon_threadsafe(self._loop.create_task, shutdown)

    def closed(self, timeout: float = 0.0) -> bool:
        """Whether its thread has ended (or never started), waiting up to `timeout` s."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()


def _serve(loop: asyncio.AbstractEventLoop, owner: EnvLoop) -> None:
    _CURRENT.loop = owner  # `resolve` from a coroutine of its own is refused, not a hang
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


async def _shutdown(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the loop's other tasks, give them a second to finish, then stop it."""
    tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=1.0)
    await loop.shutdown_asyncgens()
    loop.stop()
