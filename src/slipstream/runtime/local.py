"""The local runtime: the trainer in this process, N sampler processes beside it.

Processes are started with `spawn` (a clean interpreter: no forked torch thread pools or
locks), each with its own torch thread count. Prompt requests and finished groups travel
through bounded multiprocessing queues, weights through `SharedWeights`.

Shutdown has one path, `LocalRuntime.shutdown()`, used by a normal exit, an exception and
Ctrl-C alike (the caller runs it in `finally`; `__exit__` does):

1. set the stop event (every sampler loop checks it at least once per poll interval);
2. drain both queues while the children exit, so none stays blocked in a `put`;
3. join each child with a timeout; `terminate()`, then `kill()`, whatever is still alive;
4. close the queues without waiting for their feeder threads.

Children ignore SIGINT: a Ctrl-C in the terminal reaches the whole process group, and only
the parent decides how to stop. While shutting down the parent ignores SIGINT too, so a second
Ctrl-C cannot leave children behind. A child whose parent dies (SIGKILL) stops by itself: its
stop flag also watches the parent.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import torch
import torch.multiprocessing as mp

from slipstream.runtime.channels import Channels, PromptRequest, SamplerMessage
from slipstream.runtime.weights import SharedWeights


class Worker(Protocol):
    def run(self, channels: Channels) -> None: ...


WorkerFactory = Callable[[int], Worker]
"""Picklable; called in the child with the sampler id to build the worker there."""


def default_threads(num_samplers: int, cores: int | None = None) -> int:
    """Threads per process when the cores are split between the trainer and the samplers."""
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, cores // (num_samplers + 1))


class QueueChannel:
    """`PromptChannel` / `GroupChannel` over a bounded multiprocessing queue."""

    def __init__(self, q: Any) -> None:
        self._q = q

    def put(self, item: Any, timeout: float) -> bool:
        try:
            self._q.put(item, timeout=timeout) if timeout > 0 else self._q.put_nowait(item)
            return True
        except queue.Full:
            return False

    def get(self, timeout: float) -> Any:
        try:
            return self._q.get(timeout=timeout) if timeout > 0 else self._q.get_nowait()
        except queue.Empty:
            return None

    def depth(self) -> int:
        try:
            return self._q.qsize()
        except NotImplementedError:  # macOS
            return -1

    def drain(self) -> int:
        n = 0
        while self.get(0) is not None:
            n += 1
        return n

    def close(self) -> None:
        self._q.close()
        self._q.cancel_join_thread()  # never block on a feeder thread at exit


class LocalStop:
    """The stop flag: an event, or (in a child) the parent having died."""

    def __init__(self, event: Any) -> None:
        self._event = event
        self._parent: Any = None
        self._checked = 0.0

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        if self._event.is_set():
            return True
        now = time.monotonic()
        if self._parent is not None and now - self._checked > 0.5:
            self._checked = now
            return not self._parent.is_alive()
        return False

    def watch_parent(self) -> None:
        self._parent = mp.parent_process()


def _child_main(factory: WorkerFactory, sampler_id: int, channels: Channels, threads: int) -> None:
    """Entry point of a sampler process: build the worker, run it, report a failure."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns shutdown
    torch.set_num_threads(threads)
    assert isinstance(channels.stop, LocalStop)
    channels.stop.watch_parent()
    try:
        worker = factory(sampler_id)
        worker.run(channels)
    except BaseException:
        # flushed before exit (no cancel_join_thread here): the parent must see why
        msg = SamplerMessage("error", sampler_id, error=traceback.format_exc())
        channels.groups.put(msg, timeout=5.0)
        raise SystemExit(1) from None
    for ch in (channels.prompts, channels.groups):
        assert isinstance(ch, QueueChannel)
        ch._q.cancel_join_thread()  # stopping: unread items may be dropped, never block exit


class LocalRuntime:
    """N sampler processes; `channels` is the trainer's end of the queues and weights.

    `params` shapes the weight channel (publish version 0 before `start`, so samplers begin
    with the trainer's weights). `prompt_queue` and `group_queue` bound the two queues.
    """

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        num_samplers: int,
        threads_per_sampler: int,
        prompt_queue: int,
        group_queue: int,
        shutdown_timeout_s: float = 10.0,
    ) -> None:
        self.ctx = mp.get_context("spawn")
        self.num_samplers = num_samplers
        self.threads = threads_per_sampler
        self.shutdown_timeout_s = shutdown_timeout_s
        self.channels = Channels(
            prompts=QueueChannel(self.ctx.Queue(prompt_queue)),
            groups=QueueChannel(self.ctx.Queue(group_queue)),
            weights=SharedWeights(params, self.ctx),
            stop=LocalStop(self.ctx.Event()),
            num_samplers=num_samplers,
        )
        self.procs: list[Any] = []
        self._closed = False

    def start(self, factory: WorkerFactory) -> None:
        for i in range(self.num_samplers):
            p = self.ctx.Process(
                target=_child_main,
                args=(factory, i, self.channels, self.threads),
                name=f"slipstream-sampler{i}",
                daemon=True,
            )
            p.start()
            self.procs.append(p)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def check(self) -> None:
        """Raise if a sampler process died (its error message, if any, arrives separately)."""
        for i, p in enumerate(self.procs):
            if p.exitcode is not None and not self.channels.stop.is_set():
                why = ""
                while (m := self.channels.groups.get(0.2)) is not None:
                    if m.kind == "error":
                        why = f":\n{m.error}"
                        break
                raise RuntimeError(f"sampler {i} (pid {p.pid}) exited with code {p.exitcode}{why}")

    def shutdown(self) -> None:
        """The one shutdown path (module docstring). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        with _sigint_ignored():
            self.channels.stop.set()
            prompts, groups = self.channels.prompts, self.channels.groups
            assert isinstance(prompts, QueueChannel) and isinstance(groups, QueueChannel)
            deadline = time.monotonic() + self.shutdown_timeout_s
            while any(p.is_alive() for p in self.procs) and time.monotonic() < deadline:
                groups.drain()
                prompts.drain()
                for p in self.procs:
                    p.join(timeout=0.05)
            for p in self.procs:
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=2.0)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=2.0)
            groups.drain()
            prompts.close()
            groups.close()

    def __enter__(self) -> LocalRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    try:
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: nothing to protect
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


class Interrupts:
    """Ctrl-C and SIGTERM as a stop request, acted on at a safe point.

    Inside `catch()` (main thread only), the first SIGINT or SIGTERM only sets `requested`;
    `raise_if_requested()`, called by the loop where the run's state is consistent (between two
    messages, never inside a step), raises `KeyboardInterrupt`. So an interrupted run still
    knows where every group is, and its ledger adds up. A second signal raises at once.
    """

    def __init__(self) -> None:
        self.requested: int | None = None

    def _handler(self, signum: int, frame: object) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt(f"signal {signum} (second)")
        self.requested = signum

    def raise_if_requested(self) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt(f"signal {self.requested}")

    @contextlib.contextmanager
    def catch(self) -> Iterator[None]:
        try:
            old = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, signal.SIGTERM)}
        except ValueError:  # not the main thread: signals stay as they are
            yield
            return
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)


__all__ = [
    "Interrupts",
    "LocalRuntime",
    "PromptRequest",
    "QueueChannel",
    "default_threads",
]
