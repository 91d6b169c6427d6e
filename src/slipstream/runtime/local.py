"""The local runtime: the trainer in this process, N sampler processes beside it.

Processes are forked from a fork server that imported torch once (`runtime.processes`: as
isolated as `spawn`, no forked torch thread pools or locks, and started in milliseconds
instead of seconds), each with its own torch thread count. Prompt requests and finished groups travel
through bounded multiprocessing queues, one pair per sampler (`channels` says why), weights
through `SharedWeights`. A sampler that dies is replaced by `check()` (fresh queues, latest
weights); the orchestrator issues its requests again.

Shutdown has one path, `LocalRuntime.shutdown()`, used by a normal exit, an exception and
Ctrl-C alike (the caller runs it in `finally`; `__exit__` does):

1. set the stop event (every sampler loop checks it at least once per poll interval);
2. drain the queues while the children exit, so none stays blocked in a `put`;
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
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from typing import Any, Protocol

import torch
import torch.multiprocessing as mp

from slipstream.runtime import processes
from slipstream.runtime.channels import (
    ChannelEnd,
    Channels,
    PromptRequest,
    Router,
    SamplerMessage,
    WeightChannel,
)
from slipstream.runtime.weights import SharedWeights


class Worker(Protocol):
    def run(self, channels: Channels) -> None: ...


WorkerFactory = Callable[[int], Worker]
"""Picklable; called in the child with the sampler id to build the worker there."""

ERROR_EXIT = 3  # a sampler's exit code after it sent its `error` message: not restarted


def default_threads(num_samplers: int, cores: int | None = None) -> int:
    """Threads per process when the cores are split between the trainer and the samplers."""
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, cores // (num_samplers + 1))


def drain(channel: Any) -> int:
    """Take and drop everything waiting in `channel`; how many items that was."""
    n = 0
    while channel.get(0) is not None:
        n += 1
    return n


class QueueChannel(ChannelEnd):
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
        return drain(self)

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


def _child_main(
    factory: WorkerFactory,
    sampler_id: int,
    channels: Channels,
    threads: int,
    env: dict[str, str] | None = None,
    started: Event | None = None,
) -> None:
    """Entry point of a sampler process: build the worker, run it, report a failure. `env`
    is set before anything touches CUDA (`CUDA_VISIBLE_DEVICES`: only its own GPU); `started`
    (an event) is set first: the process got past its preparation (`check`)."""
    if started is not None:
        started.set()
    os.environ.update(env or {})
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns shutdown
    torch.set_num_threads(threads)
    assert isinstance(channels.stop, LocalStop)
    channels.stop.watch_parent()
    try:
        worker = factory(sampler_id)
        worker.run(channels)
    except BaseException:
        # flushed before exit (no cancel_join_thread here): the parent must see why. Its
        # queue may be full for as long as the trainer is busy (a step, an evaluation): wait
        # for room until the run stops, else the parent, which does not restart a sampler
        # that exits with ERROR_EXIT, never learns why it stopped
        msg = SamplerMessage("error", sampler_id, error=traceback.format_exc())
        while not channels.groups.put(msg, timeout=1.0) and not channels.stop.is_set():
            pass
        raise SystemExit(ERROR_EXIT) from None
    for ch in (channels.prompts, channels.groups):
        assert isinstance(ch, QueueChannel)
        ch._q.cancel_join_thread()  # stopping: unread items may be dropped, never block exit


class MergedGroups(ChannelEnd):
    """The trainer's end of the group channels: one reader thread per sampler moves its
    messages into one bounded in-process queue (`GroupChannel`).

    Each sampler writes to its own queue, so a sampler killed half-way through a write can
    only wedge its own reader, which is abandoned when the sampler is replaced."""

    def __init__(self, maxsize: int) -> None:
        self._q: queue.Queue[SamplerMessage] = queue.Queue(maxsize)
        self._readers: dict[int, tuple[threading.Thread, threading.Event]] = {}
        self._settling: list[tuple[threading.Thread, float]] = []  # (dead reader, give up at)
        self._closed = threading.Event()

    def attach(self, i: int, source: QueueChannel) -> None:
        """Read sampler `i`'s queue (replacing the reader of a previous incarnation)."""
        last = threading.Event()
        t = threading.Thread(
            target=self._read, args=(source, last), name=f"slipstream-groups{i}", daemon=True
        )
        self._readers[i] = (t, last)
        t.start()

    def detach(self, i: int, timeout: float) -> None:
        """Sampler `i` died: its reader moves what it managed to send, then stops; `settling`
        says so meanwhile, for at most `timeout` seconds (a torn last message blocks that
        reader forever: a daemon, abandoned then). It cannot finish while this queue is full
        and the thread that would empty it waits here, so nothing waits here."""
        t, last = self._readers.pop(i)
        last.set()
        self._settling.append((t, time.monotonic() + timeout))

    def settling(self) -> bool:
        now = time.monotonic()
        self._settling = [(t, end) for t, end in self._settling if t.is_alive() and now < end]
        return bool(self._settling)

    def _read(self, source: QueueChannel, last: threading.Event) -> None:
        while not self._closed.is_set():
            m = source.get(0.1)
            if m is None:
                if last.is_set():
                    return
                continue
            while not self._closed.is_set():
                try:
                    self._q.put(m, timeout=0.1)
                    break
                except queue.Full:
                    continue

    def put(self, message: SamplerMessage, timeout: float) -> bool:  # the trainer never sends
        raise TypeError("the trainer's end of the group channel is read-only")

    def get(self, timeout: float) -> SamplerMessage | None:
        if timeout <= 0 and self._settling and self.settling():
            timeout = 0.005  # a dead sampler's reader is moving messages in: not a busy spin
        try:
            return self._q.get(timeout=timeout) if timeout > 0 else self._q.get_nowait()
        except queue.Empty:
            return None

    def depth(self) -> int:
        return self._q.qsize()

    def drain(self) -> int:
        return drain(self)

    def close(self) -> None:
        self._closed.set()


def _weight_channel(
    params: Mapping[str, torch.Tensor], ctx: Any, devices: list[str] | None
) -> WeightChannel:
    """Shared host memory, or with any sampler on a GPU the CUDA IPC channel with one
    buffer per sampler GPU (runtime.cuda_weights): weights never pass through the host."""
    if devices and any(d.startswith("cuda") for d in devices):
        from slipstream.runtime.cuda_weights import CudaIpcWeights

        return CudaIpcWeights(params, ctx, devices)
    return SharedWeights(params, ctx)


class LocalRuntime:
    """N sampler processes; `channels` is the trainer's end of the queues and weights.

    `params` shapes the weight channel (publish version 0 before `start`, so samplers begin
    with the trainer's weights). `prompt_queue` bounds each sampler's inbox (in chunks),
    `group_queue` the groups waiting for the trainer. A sampler that dies without reporting an
    error (killed, crashed in C) is restarted with a fresh inbox, at most `max_restarts` times
    each; it loads the latest weights from the weight channel as it starts. One that exits
    by itself before its entry function runs, `max_restarts + 1` (at most `START_FAILURES`)
    times in a row, stops the run with `WorkersCannotStart` (runtime.processes).
    """

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        num_samplers: int,
        threads_per_sampler: int,
        prompt_queue: int,
        group_queue: int,
        shutdown_timeout_s: float = 10.0,
        max_restarts: int = 3,
        sampler_env: list[dict[str, str]] | None = None,
        weight_devices: list[str] | None = None,
    ) -> None:
        self.ctx = processes.context()  # forked from a server that imported torch once
        self.sampler_env = sampler_env  # per sampler, set in its process (runtime.placement)
        self.num_samplers = num_samplers
        self.threads = threads_per_sampler
        self.shutdown_timeout_s = shutdown_timeout_s
        self.max_restarts = max_restarts
        self.prompt_queue, self.group_queue = prompt_queue, group_queue
        self.inboxes = [QueueChannel(self.ctx.Queue(prompt_queue)) for _ in range(num_samplers)]
        self.outboxes = [QueueChannel(self.ctx.Queue(group_queue)) for _ in range(num_samplers)]
        self.merged = MergedGroups(group_queue)
        self.channels = Channels(
            prompts=Router(list(self.inboxes)),
            groups=self.merged,
            weights=_weight_channel(params, self.ctx, weight_devices),
            stop=LocalStop(self.ctx.Event()),
            num_samplers=num_samplers,
        )
        self.procs: list[Any] = []
        self.restarts = [0] * num_samplers
        limit = min(processes.START_FAILURES, max_restarts + 1)
        self.starts = [processes.StartFailures(limit) for _ in range(num_samplers)]
        self.started: list[Event | None] = [None] * num_samplers  # each incarnation's event
        self.failed: set[int] = set()  # samplers that exited after reporting an error
        self.factory: WorkerFactory | None = None
        self._closed = False

    def _spawn(self, i: int) -> Any:
        ch = replace(self.channels, prompts=self.inboxes[i], groups=self.outboxes[i])
        self.started[i] = self.ctx.Event()
        p = self.ctx.Process(
            target=_child_main,
            args=(
                self.factory,
                i,
                ch,
                self.threads,
                self.sampler_env[i] if self.sampler_env else None,
                self.started[i],
            ),
            name=f"slipstream-sampler{i}",
            daemon=True,
        )
        processes.start(p)
        return p

    def start(self, factory: WorkerFactory) -> None:
        self.factory = factory
        for i in range(self.num_samplers):
            self.merged.attach(i, self.outboxes[i])
            self.procs.append(self._spawn(i))

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def kill(self, i: int) -> None:
        """SIGKILL sampler `i` unless it is gone: the fork server, its parent, reaps it as it
        exits, and its pid may then be another process's (`exitcode` reads its status)."""
        p = self.procs[i]
        if p.exitcode is None:
            p.kill()  # (multiprocessing's: no signal once the exit status is known)

    def check(self) -> list[int]:
        """Restart samplers that died; the ids restarted. A sampler that reported an error
        is not restarted here: its `error` message reaches the orchestrator, which stops."""
        if self.channels.stop.is_set():
            return []
        restarted = []
        for i, p in enumerate(self.procs):
            if p.exitcode is None or i in self.failed:
                continue
            self.merged.detach(i, timeout=5.0)  # its last messages (an error?) go through
            if p.exitcode == ERROR_EXIT:  # its error message is on its way: the run stops
                self.failed.add(i)
                continue
            self._started_or_raise(i, p)
            if self.restarts[i] >= self.max_restarts:
                raise RuntimeError(
                    f"sampler {i} (pid {p.pid}) exited with code {p.exitcode} and was already "
                    f"restarted {self.restarts[i]} times (runtime.max_restarts)"
                )
            self.restarts[i] += 1
            # fresh queues: the old ones may hold a torn message or a lock the dead one held.
            # The old inbox is closed: its feeder thread may be blocked on a pipe full of
            # requests nobody reads, and Python's exit would join it (the run never exits)
            self.inboxes[i].close()
            self.inboxes[i] = QueueChannel(self.ctx.Queue(self.prompt_queue))
            self.outboxes[i] = QueueChannel(self.ctx.Queue(self.group_queue))
            router = self.channels.prompts
            assert isinstance(router, Router)
            router.replace(i, self.inboxes[i])
            self.merged.attach(i, self.outboxes[i])
            self.procs[i] = self._spawn(i)
            restarted.append(i)
        return restarted

    def _started_or_raise(self, i: int, p: BaseProcess) -> None:
        """Sampler `i` exited: `WorkersCannotStart` if it and the incarnations before it
        exited by themselves before their entry function ran (`StartFailures`)."""
        started = self.started[i]
        if self.starts[i].ended(started is not None and started.is_set(), p.exitcode):
            raise processes.WorkersCannotStart(
                f"sampler {i} exits before it starts (exit code {p.exitcode}, "
                f"{self.starts[i].in_row} times in a row). Samplers are {processes.MAIN_GUARD} "
                "(every orchestrated run started from a script needs it)"
            )

    def shutdown(self) -> None:
        """The one shutdown path (module docstring). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        with _sigint_ignored():
            self.channels.stop.set()
            deadline = time.monotonic() + self.shutdown_timeout_s
            while any(p.is_alive() for p in self.procs) and time.monotonic() < deadline:
                self.merged.drain()  # the readers keep emptying the samplers' queues
                for q in self.inboxes:
                    q.drain()
                for p in self.procs:
                    p.join(timeout=0.05)
            for p in self.procs:
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=2.0)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=2.0)
            self.merged.close()
            self.merged.drain()
            for q in (*self.inboxes, *self.outboxes):
                q.close()

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
