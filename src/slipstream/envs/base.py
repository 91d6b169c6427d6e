"""The token-level environment protocol: one `Env` per sample, built by a factory from its row.

An episode is: the prompt is `initial_observation().tokens`; the model generates a turn (up to
its end-of-sequence token, or a budget); `step(action_tokens)` gets that turn's tokens and
returns a `StepResult`; unless `done`, `next_observation.tokens` are appended to the sequence
as environment tokens and the model generates the next turn. Token in, token out: the
sequence is never re-tokenized, so what is trained is exactly what the model saw.

Either method may be a coroutine function (`async def`): it is run to completion in the
environment worker that runs the step (envs.workers), never in the engine's loop, on one event
loop per process kept across calls, so an environment may hold what it started (tasks,
subprocesses, clients) from one step to the next. The episode's reward is the sum of its
steps' rewards.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Awaitable, Callable
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

    Runs it on this process's environment event loop (in a thread of its own, kept for the
    process's life: what one call starts is there at the next); blocks until it is done, so
    call it from an environment worker, never from a coroutine on that loop.
    """
    if not inspect.isawaitable(value):
        return value
    loop = _env_loop()
    if _running_loop() is loop:  # it would wait for itself for ever
        if inspect.iscoroutine(value):
            value.close()
        raise TypeError("resolve() called on the environments' event loop: await it instead")

    async def _await() -> T:
        return await value

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
