"""Where environment steps run: `env.workers` worker processes (default) or threads.

An episode's environment lives in one worker from its first observation to its end (an `Env`
is stateful: it is built there by the factory and never leaves). The episode runner
(schedule.episodes) asks for `first(key, row)` and `step(key, tokens)` and gets a
`concurrent.futures.Future` of `(observation or step result, seconds in the worker)`; a step
that raises fails its future with `EnvError` (the episode ends `error`).

`ProcessWorkers` (`env.isolation = "process"`): each worker is a process forked from a
forkserver that has slipstream imported; it runs one step at a time (`env.worker_concurrency`
= 1, the default), so a step's time limit is exact: a step past `env.step_timeout_s` is ended
by SIGKILLing its worker (`abandon`). With `worker_concurrency` = c > 1 a worker runs up to c
steps of its episodes at once, each in a thread of its own inside it (a `ThreadWorkers` of c
threads there): a slow step no longer holds up the other episodes homed in that worker, at
the price that a timed-out step's SIGKILL ends the other steps running there too. A worker
that dies, killed for a timeout or by anything else (a segfault, the OOM killer, a SIGKILL),
fails its running operations and queued steps with `WorkerDied`, and every other episode whose
environment lived in it ends as well (its state is gone) at its next step: their reason is
`crash`. A fresh worker takes its place at once; first observations still queued there wait
for it (nothing of theirs was lost). Both kinds run queued operations oldest episode first
(envs.order), not in the order they were asked: the episodes admitted first belong to the
groups the trainer needs next. Factories must be picklable (module-level functions or
classes); steps and observations go through pipes. If the sampler itself dies,
each worker exits at its next read (the pipe closes), or at once if it is inside a step (the
kernel kills it with its parent, the sampler's fork server). Each worker's temporary files
(`tempfile`, `TMPDIR`: the `python` sandbox's working directories among them) live in a folder
of its own, removed when the worker is replaced or closed, so a worker killed in the middle of
a call leaves none behind (its own `finally` never ran). The workers' folders are inside one
folder of the pool (envs.scratch), which a janitor process removes when the pool's owner
closes it or dies, SIGKILLed included, so a killed sampler leaves none behind either.

`ThreadWorkers` (`env.isolation = "thread"`): steps run in threads of the caller's process;
nothing is pickled (tests that inspect their environments use it), a step past the limit is
abandoned (its thread cannot be killed: it runs on, and a fresh thread takes its place among
the `n`) and a crash of native code takes the sampler down. Each async environment runs on an
event loop of its own (envs.base `EnvLoop`, closed when its episode ends or is abandoned), so
one that blocks inside a coroutine delays no other environment's step.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import heapq
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import ForkingPickler
from typing import Literal, Protocol

from slipstream.envs.base import (
    Env,
    EnvFactory,
    EnvLoop,
    Observation,
    StepResult,
    resolve,
    using_loop,
)
from slipstream.envs.order import Ranks
from slipstream.envs.scratch import ScratchRoot
from slipstream.parent import die_with_parent
from slipstream.runtime import processes
from slipstream.runtime.processes import START_FAILURES, WorkersCannotStart
from slipstream.types import Prompt

Isolation = Literal["process", "thread"]
Outcome = tuple[Observation | StepResult, float]  # what a step gave, seconds in the worker


class EnvError(RuntimeError):
    """The environment (its factory, `initial_observation` or `step`) raised; the message."""


class WorkerDied(RuntimeError):
    """The worker process that held the episode's environment died."""


class Workers(Protocol):
    def first(self, key: Hashable, row: Prompt) -> cf.Future[Outcome]: ...

    def step(self, key: Hashable, tokens: list[int]) -> cf.Future[Outcome]: ...

    def started(self, key: Hashable) -> float | None:
        """`time.monotonic()` when `key`'s current step began running (None: queued, none)."""
        ...

    def abandon(self, key: Hashable) -> None:
        """`key`'s running step is past its time limit: stop it as well as the mode can."""
        ...

    def end(self, key: Hashable) -> None:
        """The episode ended: its environment is dropped, its queued operation never runs."""
        ...

    def overdue(self, limit_s: float) -> None:
        """Stop, as `abandon` would, the steps of ended episodes still running after `limit_s`
        (an episode cancelled mid-step has no runner timing it any more)."""
        ...

    def pump(self, timeout: float) -> None:
        """Collect finished steps, waiting up to `timeout` s for one if none is ready."""
        ...

    def close(self) -> None: ...


OpArg = Prompt | list[int]  # "first": the dataset row; "step": the model's action tokens


def _run_op(
    envs: dict[Hashable, Env], factory: EnvFactory, op: str, key: Hashable, arg: OpArg
) -> Observation | StepResult:
    """One operation on `envs`: the first observation (building the env) or a step."""
    if op == "first":
        assert isinstance(arg, Prompt)
        env = factory(arg)
        obs = resolve(env.initial_observation())
        envs[key] = env
        return obs
    assert isinstance(arg, list)
    return resolve(envs[key].step(arg))


# ---- threads ----------------------------------------------------------------------------------
@dataclass(eq=False)  # (hashed by identity: a member of `running`)
class _ThreadOp:
    op: str
    key: Hashable
    arg: OpArg
    future: cf.Future[Outcome] = field(default_factory=cf.Future)
    t_start: float | None = None  # when it started running (None: queued)


class ThreadWorkers:
    """Steps in `n` threads of this process (module docstring): at most `n` operations run at
    once, each in a daemon thread of its own; an abandoned one no longer counts (its thread
    runs on, and what it returns is ignored), so `n` remain for the others."""

    def __init__(self, factory: EnvFactory, n: int) -> None:
        self.factory, self.n = factory, n
        self.envs: dict[Hashable, Env] = {}
        self.loops: dict[Hashable, EnvLoop] = {}  # each environment's event loop
        self.futures: dict[Hashable, cf.Future[Outcome]] = {}
        self.ops: dict[Hashable, _ThreadOp] = {}  # each episode's current operation
        # queued operations, oldest episode first: (its rank, arrival, operation)
        self.queue: list[tuple[int, int, _ThreadOp]] = []
        self.order = Ranks()
        self.running: set[_ThreadOp] = set()  # the operations that hold one of the n
        self.lock = threading.Lock()  # the caller's thread against the operations' threads
        self.closed = False

    def _submit(self, op: str, key: Hashable, arg: OpArg) -> cf.Future[Outcome]:
        item = _ThreadOp(op, key, arg)
        with self.lock:  # queued: not started (the previous operation's time is no more)
            self.ops[key], self.futures[key] = item, item.future
            heapq.heappush(self.queue, (self.order.rank(key, op), self.order.arrival(), item))
        self._start()
        return item.future

    def _start(self) -> None:
        """Start queued operations while fewer than `n` run; drop those of ended episodes."""
        with self.lock:
            while self.queue and len(self.running) < self.n and not self.closed:
                item = heapq.heappop(self.queue)[2]
                if self.ops.get(item.key) is not item:  # ended while queued: never runs
                    item.future.cancel()
                    continue
                self.running.add(item)
                item.t_start = t0 = time.monotonic()
                args = (item, t0)
                threading.Thread(
                    target=self._run, args=args, name="slipstream-env", daemon=True
                ).start()

    def _run(self, item: _ThreadOp, t0: float) -> None:
        built: dict[Hashable, Env] = {}
        envs = self.envs if item.op == "step" else built
        with self.lock:  # a step runs on its environment's loop; a first observation on a new
            own = self.loops.get(item.key) if item.op == "step" else None
        loop, kept, old = own or EnvLoop(), own is not None, None
        try:
            with using_loop(loop):
                out = _run_op(envs, self.factory, item.op, item.key, item.arg)
            with self.lock:  # (an abandoned first observation keeps no environment)
                if self.ops.get(item.key) is item and item.op == "first":
                    self.envs.update(built)
                    old, self.loops[item.key], kept = self.loops.get(item.key), loop, True
            if old is not None:  # (a key used again before its end: the old environment's)
                old.close()
            item.future.set_result((out, time.monotonic() - t0))
        except BaseException as e:  # (SystemExit too: the future must resolve)
            item.future.set_exception(EnvError(f"{type(e).__name__}: {e}"[:500]))
        finally:
            if not kept:
                loop.close()
            with self.lock:
                self.running.discard(item)
            self._start()

    def first(self, key: Hashable, row: Prompt) -> cf.Future[Outcome]:
        return self._submit("first", key, row)

    def step(self, key: Hashable, tokens: list[int]) -> cf.Future[Outcome]:
        return self._submit("step", key, tokens)

    def started(self, key: Hashable) -> float | None:
        item = self.ops.get(key)  # (a new operation of `key` replaces it: queued, None)
        return item.t_start if item is not None else None

    def abandon(self, key: Hashable) -> None:
        with self.lock:  # its thread runs on; another takes its place among the n
            item = self.ops.get(key)
            if item is not None:
                self.running.discard(item)
        self.end(key)
        self._start()

    def end(self, key: Hashable) -> None:
        with self.lock:
            self.order.forget(key)
            self.ops.pop(key, None)
            self.envs.pop(key, None)
            self.futures.pop(key, None)
            loop = self.loops.pop(key, None)
        if loop is not None:  # (an abandoned step awaiting on it is cancelled)
            loop.close()

    def overdue(self, limit_s: float) -> None:
        now = time.monotonic()
        with self.lock:  # an ended episode's item is no longer its key's operation
            late = [
                i
                for i in self.running
                if self.ops.get(i.key) is not i and now - (i.t_start or now) > limit_s
            ]
            self.running.difference_update(late)  # their threads run on, ignored
        if late:
            self._start()

    def pump(self, timeout: float) -> None:
        running = [f for f in list(self.futures.values()) if not f.done()]
        if timeout > 0 and running:
            cf.wait(running, timeout=timeout, return_when=cf.FIRST_COMPLETED)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            queued, self.queue = [item for *_, item in self.queue], []
            loops, self.loops = list(self.loops.values()), {}
        for item in queued:
            item.future.cancel()
        for loop in loops:
            loop.close()


# ---- processes --------------------------------------------------------------------------------
def _worker_main(conn: Connection, factory: EnvFactory, scratch: str, concurrency: int = 1) -> None:
    """A worker process: run operations one at a time (or `concurrency` at once:
    `_serve_concurrently`) until the pipe closes (or, in the middle of one, its parent dies:
    `die_with_parent`); its temporary files go to `scratch`."""
    die_with_parent()
    os.environ["TMPDIR"] = tempfile.tempdir = scratch  # (what it starts inherits TMPDIR)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the sampler's to handle
    if concurrency > 1:
        _serve_concurrently(conn, ThreadWorkers(factory, concurrency))
        return
    envs: dict[Hashable, Env] = {}
    while True:
        try:
            op, key, arg = conn.recv()
        except (EOFError, OSError):
            return  # the sampler is gone
        if op == "drop":
            envs.pop(key, None)
            continue
        if op == "close":
            return
        t0 = time.monotonic()
        try:
            msg: tuple[str, Hashable, Observation | StepResult | str, float] = (
                "ok", key, _run_op(envs, factory, op, key, arg), 0.0
            )  # fmt: skip
        except (Exception, SystemExit) as e:  # the environment raised: reported, it goes on
            envs.pop(key, None)
            msg = ("err", key, f"{type(e).__name__}: {e}"[:500], 0.0)
        if not _reply(conn, (*msg[:3], time.monotonic() - t0)):
            return


def _reply(
    conn: Connection, msg: tuple[str, Hashable, Observation | StepResult | str, float]
) -> bool:
    """Send a worker's answer to `msg[1]`'s operation; a result that does not pickle is sent
    as that operation's error. False: the sampler is gone (the pipe is closed)."""
    try:
        conn.send(msg)
    except (EOFError, OSError):
        return False
    except Exception as e:  # the result does not pickle
        conn.send(("err", msg[1], f"step result cannot be sent: {type(e).__name__}: {e}", 0.0))
    return True


def _serve_concurrently(conn: Connection, pool: ThreadWorkers) -> None:
    """A worker's loop under `env.worker_concurrency` > 1: every operation goes to `pool` as it
    arrives (the sampler sends at most the pool's size at once), and each reply is sent from
    the thread that finished it, one send at a time; a drop ends that environment."""
    lock = threading.Lock()

    def reply(key: Hashable, fut: cf.Future[Outcome]) -> None:
        try:  # (a cancelled one is answered too: the sampler counts it as running until then)
            out, seconds = fut.result()
            msg: tuple[str, Hashable, Observation | StepResult | str, float] = (
                "ok", key, out, seconds
            )  # fmt: skip
        except cf.CancelledError:
            msg = ("err", key, "its episode ended before the step ran", 0.0)
        except Exception as e:  # EnvError: its text is the environment's exception
            msg = ("err", key, str(e)[:500], 0.0)
        with lock:  # (the sampler gone: the main loop sees the pipe close)
            _reply(conn, msg)

    while True:
        try:
            op, key, arg = conn.recv()
        except (EOFError, OSError):
            return
        if op == "drop":
            pool.end(key)
        elif op == "close":
            return
        else:
            fut = pool.first(key, arg) if op == "first" else pool.step(key, arg)
            fut.add_done_callback(functools.partial(reply, key))


@dataclass(eq=False)  # (compared by identity: queues remove and skip it)
class _Op:
    op: str
    key: Hashable
    arg: OpArg
    future: cf.Future[Outcome]
    t_start: float | None = None


@dataclass
class _Worker:
    proc: BaseProcess
    conn: Connection
    scratch: str  # its temporary folder (module docstring), removed with it
    queue: deque[_Op] = field(default_factory=deque)
    running: dict[Hashable, _Op] = field(default_factory=dict)  # by episode: one op each
    keys: set[Hashable] = field(default_factory=set)  # episodes whose environment lives here
    drops: list[Hashable] = field(default_factory=list)  # to send when it has room
    replied: bool = False  # answered at least one operation


class ProcessWorkers:
    """Steps in `n` worker processes (module docstring). Not thread-safe: one loop drives it."""

    def __init__(self, factory: EnvFactory, n: int, concurrency: int = 1) -> None:
        self.factory, self.concurrency = factory, concurrency  # operations a worker runs at once
        self.ctx = processes.context()
        self.scratch = ScratchRoot()  # the workers' folders (module docstring)
        self.workers = [self._spawn() for _ in range(n)]
        self.home: dict[Hashable, int] = {}  # episode -> index of the worker holding its env
        self.lost: dict[Hashable, str] = {}  # episodes whose worker died: why
        self.order = Ranks()
        self.deaths = 0  # workers that died (killed for a timeout or otherwise)
        self.starts = processes.StartFailures(START_FAILURES)  # exits before a first reply

    def _spawn(self) -> _Worker:
        ours, theirs = self.ctx.Pipe(duplex=True)
        scratch = self.scratch.folder()
        args = (theirs, self.factory, scratch, self.concurrency)
        proc = self.ctx.Process(target=_worker_main, args=args, name="slipstream-env", daemon=True)
        # a sampler is a daemonic process, which multiprocessing forbids children lest they
        # outlive it; these cannot: each exits when its pipe to the sampler closes
        config = mp.current_process()._config  # type: ignore[attr-defined]
        daemon = config.get("daemon")
        config["daemon"] = False
        try:
            processes.start(proc)
        finally:
            config["daemon"] = daemon
        theirs.close()
        return _Worker(proc, ours, scratch)

    # ---- the protocol ---------------------------------------------------------------------
    def first(self, key: Hashable, row: Prompt) -> cf.Future[Outcome]:
        i = min(range(len(self.workers)), key=lambda j: self._load(j))
        self.order.rank(key, "first")
        self.home[key] = i
        self.workers[i].keys.add(key)
        return self._enqueue(i, _Op("first", key, row, cf.Future()))

    def step(self, key: Hashable, tokens: list[int]) -> cf.Future[Outcome]:
        fut: cf.Future[Outcome] = cf.Future()
        if key in self.lost or key not in self.home:
            fut.set_exception(WorkerDied(self.lost.get(key, "no environment for this episode")))
            return fut
        return self._enqueue(self.home[key], _Op("step", key, tokens, fut))

    def started(self, key: Hashable) -> float | None:
        i = self.home.get(key)
        run = self.workers[i].running.get(key) if i is not None else None
        return run.t_start if run is not None else None

    def abandon(self, key: Hashable) -> None:
        i = self.home.get(key)
        if i is None:
            return
        if key in self.workers[i].running:
            self._kill(i, f"its worker was killed: another episode's step timed out ({key!r})")
        self.end(key)

    def overdue(self, limit_s: float) -> None:
        now = time.monotonic()
        for i, w in enumerate(self.workers):  # (a running op of no homed key: its episode ended)
            late = [
                k
                for k, op in w.running.items()
                if k not in self.home and now - (op.t_start or now) > limit_s
            ]
            if late:
                why = f"an ended episode's step ran past {limit_s:g} s ({late[0]!r})"
                self._kill(i, f"its worker was killed: {why}")

    def _kill(self, i: int, why: str) -> None:
        """SIGKILL worker `i` and replace it (`_died`), for `why` unless it had died by itself."""
        w = self.workers[i]
        ended = w.proc.exitcode is not None  # by itself, before the timeout: its own reason
        with contextlib.suppress(ProcessLookupError, AttributeError):
            w.proc.kill()
        w.proc.join(5.0)
        self._died(i, self._why(w) if ended else why)

    def end(self, key: Hashable) -> None:
        self.lost.pop(key, None)
        self.order.forget(key)
        i = self.home.pop(key, None)
        if i is None:
            return
        w = self.workers[i]
        w.keys.discard(key)
        for op in [op for op in w.queue if op.key == key]:  # queued: never to run
            w.queue.remove(op)
            op.future.cancel()
        w.drops.append(key)
        self._dispatch(i)

    def pump(self, timeout: float) -> None:
        for i in range(len(self.workers)):
            self._dispatch(i)
        busy = [w for w in self.workers if w.running]
        if not busy:
            return
        ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout)
        for i, w in enumerate(self.workers):
            if w.running and (w.conn in ready or w.proc.sentinel in ready):
                self._collect(i)

    def close(self) -> None:
        for w in self.workers:
            with contextlib.suppress(OSError, ValueError):
                w.conn.send(("close", None, None))
        deadline = time.monotonic() + 1.0
        for w in self.workers:
            w.proc.join(max(deadline - time.monotonic(), 0.0))
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(5.0)
            w.conn.close()
            shutil.rmtree(w.scratch, ignore_errors=True)
            for op in [*w.queue, *w.running.values()]:
                if not op.future.done():
                    op.future.set_exception(WorkerDied("the environment workers were closed"))
        self.scratch.close()

    # ---- internals ------------------------------------------------------------------------
    def _load(self, i: int) -> tuple[int, int]:
        w = self.workers[i]
        return (len(w.keys), len(w.queue) + len(w.running))

    def _enqueue(self, i: int, op: _Op) -> cf.Future[Outcome]:
        self.workers[i].queue.append(op)
        self._dispatch(i)
        return op.future

    def _dispatch(self, i: int) -> None:
        """Send the worker its drops and its next operations, while it runs fewer than
        `concurrency` (one episode's operations one after another)."""
        w = self.workers[i]
        if len(w.running) >= self.concurrency:
            return
        try:
            # an episode ended while its operation runs (`EpisodeRunner.cancel`) is dropped
            # once that operation has answered: the worker never ends an environment in use
            drops = [k for k in w.drops if k not in w.running]
            for key in drops:
                w.conn.send(("drop", key, None))
            w.drops = [k for k in w.drops if k in w.running]
            while len(w.running) < self.concurrency:  # the oldest episode's first
                ready = (op for op in w.queue if op.key not in w.running)
                op = min(ready, key=lambda op: self.order.of(op.key), default=None)
                if op is None:
                    return
                w.queue.remove(op)
                try:  # pickled whole before a byte is written: a refusal leaves the pipe clean
                    message = ForkingPickler.dumps((op.op, op.key, op.arg))
                except Exception as e:  # a row holding what cannot pickle: this episode's error
                    op.future.set_exception(
                        EnvError(f"cannot send to a worker: {type(e).__name__}: {e}"[:500])
                    )
                    continue
                op.t_start, w.running[op.key] = time.monotonic(), op  # before the send: if the
                w.conn.send_bytes(message)  # send fails, `_died` fails this op too
        except (OSError, ValueError):  # its pipe is broken: it died (while idle, unnoticed)
            self._died(i, self._why(w))

    def _collect(self, i: int) -> None:
        """Every reply worker `i` has ready (at least one: `pump` saw its pipe or its end)."""
        w = self.workers[i]
        while True:
            try:
                status, key, payload, seconds = w.conn.recv()
            except (EOFError, OSError):
                w.proc.join(5.0)
                self._died(i, self._why(w))
                return
            op, w.replied = w.running.pop(key), True
            self.starts.alive()
            if status == "ok":
                op.future.set_result((payload, seconds))
            else:
                op.future.set_exception(EnvError(payload))
            try:
                more = w.running and w.conn.poll()
            except (EOFError, OSError):
                more = True  # (the next recv says it died)
            if not more:
                break
        self._dispatch(i)

    def _why(self, w: _Worker) -> str:
        code = w.proc.exitcode
        if code is not None and code < 0:
            return f"environment worker died (signal {signal.Signals(-code).name})"
        return f"environment worker died (exit code {code})"

    def _died(self, i: int, why: str) -> None:
        """Worker `i` is gone: fail what it held, put a fresh one in its place. Raises
        `WorkersCannotStart` when `START_FAILURES` fresh workers in a row exited by themselves
        before their first reply (a worker killed by a signal never counts)."""
        w = self.workers[i]
        self.deaths += 1
        shutil.rmtree(w.scratch, ignore_errors=True)  # what it left mid-call (a sandbox's)
        if self.starts.ended(w.replied, w.proc.exitcode):
            raise WorkersCannotStart(
                f"environment workers exit before their first reply ({why}, "
                f"{self.starts.in_row} in a row). They are {processes.MAIN_GUARD} and that the env "
                "factory unpickles (importable, not defined in the main script); or set "
                'env.isolation="thread"'
            )
        # a queued first observation lost nothing (its environment was never built): it
        # waits for the fresh worker; the running operation and queued steps fail
        again = [op for op in w.queue if op.op == "first"]
        for op in [*w.running.values(), *w.queue]:
            if all(op is not a for a in again) and not op.future.done():
                op.future.set_exception(WorkerDied(why))
        for key in w.keys - {op.key for op in again}:
            self.lost[key] = why
        with contextlib.suppress(OSError):
            w.conn.close()
        fresh = self._spawn()
        fresh.keys = set(w.keys)  # still homed here until they end (their steps fail)
        fresh.queue.extend(again)
        self.workers[i] = fresh


def make_workers(
    factory: EnvFactory, n: int, isolation: Isolation, concurrency: int = 1
) -> Workers:
    """`n` process or thread workers for `factory` (`env.workers`, `env.isolation`); a process
    worker runs `concurrency` steps at once (`env.worker_concurrency`)."""
    if isolation == "process":
        return ProcessWorkers(factory, n, concurrency)
    return ThreadWorkers(factory, n)
