"""The Ray runtime's channels: actor queues and the weight channel's two ends.

`QueueActor` holds a bounded FIFO of pickled messages; `RayQueue` is a `PromptChannel` or
`GroupChannel` over one. `FlatLayout` packs parameters into one byte buffer per dtype;
`TrainerWeights` publishes them (object store or torch.distributed broadcast) and
`SamplerWeights`, inside a sampler actor, serves the sampler's reads. `ray.py` says how they
fit together; every wait here has a timeout and raises `RemoteTimeout` naming what it waited
for.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Mapping
from typing import Any

import ray
import torch
import torch.distributed as dist
from ray.exceptions import GetTimeoutError, RayActorError

from slipstream.runtime.buckets import CollectiveTimeout, broadcast_buckets
from slipstream.runtime.channels import ChannelEnd


class RemoteTimeout(TimeoutError):
    """A remote call got no answer in time: the actor it names is stuck (or its node is gone)."""


def get(ref: Any, timeout: float, what: str) -> Any:
    """`ray.get` that raises `RemoteTimeout` naming `what` instead of waiting forever."""
    try:
        return ray.get(ref, timeout=timeout)
    except GetTimeoutError:
        raise RemoteTimeout(
            f"ray runtime: {what} did not answer within {timeout:.1f}s (runtime.call_timeout_s)"
        ) from None


# ---- queues -------------------------------------------------------------------------------------
LONG_POLL_S = 1.0  # a prefetching reader's outstanding get waits this long at the queue actor


@ray.remote(num_cpus=0, max_restarts=0)
class QueueActor:
    """A bounded FIFO of byte strings; an async actor, so waiting calls do not block others."""

    def __init__(self, maxsize: int) -> None:
        self._q: asyncio.Queue[bytes] = asyncio.Queue(maxsize)
        # Ray does not promise an async actor runs one caller's calls in the order sent, and
        # it interleaves running calls at their awaits: a pipelining writer numbers its calls
        # and each waits for its turn (`_next`), which comes once the one before has finished
        self._next: dict[str, int] = {}  # writer -> number of its next call to serve
        self._turn = asyncio.Condition()

    async def put(self, item: bytes, timeout: float) -> bool:
        return await self.put_many([item], timeout)

    async def put_many(
        self, items: list[bytes], timeout: float, writer: str = "", seq: int = -1
    ) -> bool:
        """Each of `items` in order, each waiting up to `timeout` for room (0: none); False
        when one finds none (the rest are not put). With `writer` and `seq` (0, 1, ... per
        writer), the call first waits (up to `timeout`) until the writer's earlier calls have
        been served."""
        if writer:
            try:
                async with self._turn:
                    await asyncio.wait_for(
                        self._turn.wait_for(lambda: self._next.get(writer, 0) == seq), timeout
                    )
            except TimeoutError:
                return False
        try:
            return await self._put_all(items, timeout)
        finally:
            if writer:
                async with self._turn:
                    self._next[writer] = seq + 1
                    self._turn.notify_all()

    async def _put_all(self, items: list[bytes], timeout: float) -> bool:
        for item in items:
            try:
                if timeout <= 0:
                    self._q.put_nowait(item)
                else:
                    await asyncio.wait_for(self._q.put(item), timeout)
            except (TimeoutError, asyncio.QueueFull):
                return False
        return True

    async def get(self, timeout: float, n: int) -> list[bytes]:
        """Up to `n` items; waits up to `timeout` for the first one."""
        items = []
        try:
            if timeout <= 0:
                items.append(self._q.get_nowait())
            else:
                items.append(await asyncio.wait_for(self._q.get(), timeout))
        except (TimeoutError, asyncio.QueueEmpty):
            return []
        while len(items) < n and not self._q.empty():
            items.append(self._q.get_nowait())
        return items

    async def qsize(self) -> int:
        return self._q.qsize()

    async def pid(self) -> int:
        return os.getpid()


class RayQueue(ChannelEnd):
    """`PromptChannel` / `GroupChannel` over a `QueueActor`; picklable (a sampler gets its end
    as an argument). Settings, per end:

    - `batch` > 1: up to that many items per get (fewer round trips; the items a reader holds
      have left the queue, so up to `batch` wait beyond its bound).
    - `window` > 0 pipelines puts: a put returns once sent, up to `window` calls in flight,
      each waiting at the queue actor up to `call_timeout_s` for room (calls are numbered and
      the actor serves each writer's one at a time in that order, so messages keep their order; Ray
      alone does not promise it for an async actor); a full window is
      the back-pressure, and a put the actor refused raises `RemoteTimeout`.
    - `coalesce` (with a window) gathers puts and sends them in one call on `push()` or at 16;
      a `push(force=False)` (a busy sampler's, every engine step) waits until the oldest is
      `linger_s` old.
    - `prefetch` keeps one get outstanding at the queue actor (it returns as soon as an item
      arrives, or empty after `LONG_POLL_S`), so a `get` costs a local readiness check instead
      of a round trip, and items travel while the reader works.
    """

    def __init__(
        self, name: str, actor: Any, call_timeout_s: float, batch: int = 1, window: int = 0
    ) -> None:
        self.name, self.actor, self.call_timeout_s, self.batch = name, actor, call_timeout_s, batch
        self.window = window
        self._buf: deque[Any] = deque()
        self._sent: deque[Any] = deque()  # pipelined puts not yet confirmed
        self.coalesce = False
        self.linger_s = 0.0
        self._out_since = 0.0
        self._pending: tuple[Any, float] | None = None  # (prefetching get, sent at)
        self._writer = ""  # this end's name at the queue actor, set at its first pipelined put
        self._seq = 0  # number of its next pipelined call
        self._out: list[bytes] = []  # coalesced puts not yet sent

    @classmethod
    def create(cls, name: str, maxsize: int, call_timeout_s: float) -> RayQueue:
        return cls(name, QueueActor.remote(maxsize), call_timeout_s)  # type: ignore[attr-defined]

    def __getstate__(self) -> dict[str, Any]:
        # a copy (another process, a restarted sampler) is a new writer, numbered from 0
        return {
            **self.__dict__, "_buf": deque(), "_sent": deque(), "_out": [], "_pending": None,
            "_writer": "", "_seq": 0,
        }  # fmt: skip

    def _confirm(self, ref: Any, timeout: float) -> None:
        if not get(ref, timeout, f"queue {self.name!r} (put)"):
            raise RemoteTimeout(
                f"ray runtime: queue {self.name!r} had no room for {self.call_timeout_s:.1f}s "
                "(runtime.call_timeout_s): its reader is stuck"
            )

    def _room(self, timeout: float) -> bool:
        """Confirm finished pipelined puts; False if the window stays full for `timeout`."""
        while self._sent and ray.wait([self._sent[0]], timeout=0)[0]:
            self._confirm(self._sent.popleft(), self.call_timeout_s)
        if len(self._sent) >= self.window:
            if not ray.wait([self._sent[0]], timeout=max(timeout, 0.0))[0]:
                return False  # the window is full: back-pressure
            self._confirm(self._sent.popleft(), self.call_timeout_s)
        return True

    def push(self, force: bool = True) -> None:
        """Send the coalesced puts now, in one call; with `force` false, only once the oldest
        has waited `linger_s` (a busy sampler calls this every engine step)."""
        if self._out and (force or time.monotonic() - self._out_since >= self.linger_s):
            self._send_many(self._out)
            self._out = []

    def _send_many(self, items: list[bytes]) -> None:
        """One pipelined call, numbered so that the queue actor serves this end's calls in
        the order sent."""
        if not self._writer:
            self._writer = uuid.uuid4().hex
        ref = self.actor.put_many.remote(items, self.call_timeout_s, self._writer, self._seq)
        self._seq += 1
        self._sent.append(ref)

    def put(self, item: Any, timeout: float) -> bool:
        data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        if self.window:
            if not self._room(timeout):
                return False
            if self.coalesce:
                if not self._out:
                    self._out_since = time.monotonic()
                self._out.append(data)
                if len(self._out) >= 16:
                    self.push()
            else:
                self._send_many([data])
            return True
        ref = self.actor.put.remote(data, timeout)
        return bool(get(ref, timeout + self.call_timeout_s, f"queue {self.name!r} (put)"))

    def flush(self, timeout: float) -> None:
        """Wait (up to `timeout`) until every pipelined put has reached the queue actor."""
        self.push()
        if self._sent:
            ray.wait(list(self._sent), num_returns=len(self._sent), timeout=timeout)
            self._sent.clear()

    def get(self, timeout: float) -> Any:
        if not self._buf:
            if self.prefetch:
                self._fetch(timeout)
            else:
                ref = self.actor.get.remote(timeout, self.batch)
                items = get(ref, timeout + self.call_timeout_s, f"queue {self.name!r} (get)")
                self._buf.extend(pickle.loads(b) for b in items)
        return self._buf.popleft() if self._buf else None

    def _fetch(self, timeout: float) -> None:
        """Prefetching: take what the outstanding get brings (waiting up to `timeout` for an
        item), sending the next get as each returns."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while not self._buf:
            if self._pending is None:
                self._ask()
            assert self._pending is not None
            ref, sent = self._pending
            if not ray.wait([ref], timeout=max(deadline - time.monotonic(), 0.0))[0]:
                if time.monotonic() - sent > LONG_POLL_S + self.call_timeout_s:
                    raise RemoteTimeout(
                        f"ray runtime: queue {self.name!r} (get) did not answer within "
                        f"{self.call_timeout_s:.1f}s (runtime.call_timeout_s)"
                    )
                return
            items = get(ref, self.call_timeout_s, f"queue {self.name!r} (get)")
            self._buf.extend(pickle.loads(b) for b in items)
            self._ask()
            if time.monotonic() >= deadline:
                return

    def _ask(self) -> None:
        """Send the outstanding get of a prefetching reader."""
        self._pending = (self.actor.get.remote(LONG_POLL_S, self.batch), time.monotonic())

    def depth(self) -> int:
        n = get(self.actor.qsize.remote(), self.call_timeout_s, f"queue {self.name!r} (qsize)")
        return int(n) + len(self._buf)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)


# ---- weights ------------------------------------------------------------------------------------
class FlatLayout:
    """Where each parameter lives in one flat byte buffer per dtype (as in `weights.py`)."""

    def __init__(self, params: Mapping[str, torch.Tensor]) -> None:
        self.entries: list[tuple[str, torch.dtype, int, int, tuple[int, ...]]] = []
        self.sizes: dict[torch.dtype, int] = {}
        for name, p in params.items():
            off = self.sizes.get(p.dtype, 0)
            self.entries.append((name, p.dtype, off, p.numel(), tuple(p.shape)))
            self.sizes[p.dtype] = off + p.numel()

    def flatten(
        self, params: Mapping[str, torch.Tensor], device: torch.device | str = "cpu"
    ) -> dict[torch.dtype, torch.Tensor]:
        """A fresh uint8 buffer per dtype holding `params`, on `device` (a GPU for NCCL:
        the copy is device to device), each parameter cast to the layout's dtype."""
        flats = {dt: torch.empty(n, dtype=dt, device=device) for dt, n in self.sizes.items()}
        with torch.no_grad():
            for name, dtype, off, n, _ in self.entries:
                flats[dtype][off : off + n].copy_(params[name].detach().reshape(-1))
        return {dt: f.view(torch.uint8) for dt, f in flats.items()}

    def empty(self, device: str = "cpu") -> dict[torch.dtype, torch.Tensor]:
        itemsize = {dt: dt.itemsize for dt in self.sizes}
        return {
            dt: torch.empty(n * itemsize[dt], dtype=torch.uint8, device=device)
            for dt, n in self.sizes.items()
        }

    def views(self, flats: Mapping[torch.dtype, torch.Tensor]) -> dict[str, torch.Tensor]:
        typed = {dt: f.view(dt) for dt, f in flats.items()}
        return {
            name: typed[dt][off : off + n].view(shape) for name, dt, off, n, shape in self.entries
        }


class SamplerWeights:
    """The sampler's end of the weight channel (`WeightChannel.read`/`version`), inside its
    actor: the trainer's `offer` and `recv_broadcast` calls, run on the actor's other threads,
    set the latest (version, source) under a lock; `read` takes it from there."""

    def __init__(self, layout: FlatLayout, call_timeout_s: float) -> None:
        self.layout, self.call_timeout_s = layout, call_timeout_s
        self._lock = threading.Lock()
        self._version = -1
        self._source: Any = None  # [ObjectRef] or {dtype: uint8 tensor}
        self._held: Any = None  # the object the last read's tensors point into

    def offer(self, version: int, source: Any) -> None:
        with self._lock:
            if version > self._version:
                self._version, self._source = version, source

    def version(self) -> int:
        return self._version

    def read(self, newer_than: int, timeout: float) -> tuple[dict[str, torch.Tensor], int] | None:
        with self._lock:
            version, source = self._version, self._source
        if version <= newer_than:
            return None
        if isinstance(source, list):  # object store: zero-copy views of the fetched buffers
            arrays = get(source[0], timeout + self.call_timeout_s, f"weights v{version} fetch")
            with warnings.catch_warnings():  # read-only memory: the engine only copies from it
                warnings.simplefilter("ignore", UserWarning)
                source = {dt: torch.from_numpy(a) for dt, a in arrays.items()}
        self._held = source  # the tensors stay valid until the next read
        return self.layout.views(source), version

    def publish(self, params: Mapping[str, torch.Tensor], version: int) -> float:
        raise TypeError("a sampler's end of the weight channel is read-only")


def _failed(ref: Any) -> bool:
    """The remote call behind `ref` has finished with an error."""
    if not ray.wait([ref], timeout=0)[0]:
        return False
    try:
        ray.get(ref, timeout=0)
    except Exception:  # any failure of the call is what we are asking about
        return True
    return False


class TrainerWeights:
    """The trainer's end of the weight channel (`publish`, `version`); `RayRuntime` attaches
    the sampler actors (and the broadcast group) once they exist."""

    def __init__(self, params: Mapping[str, torch.Tensor], transport: str, timeout: float) -> None:
        self.layout = FlatLayout(params)
        self.transport, self.call_timeout_s = transport, timeout
        self.actors: list[Any] = []
        self.broadcasting = False  # the group is formed and every member alive
        self.fallbacks = 0  # broadcasts given up for the object store
        self._version = -1
        self._flats: dict[torch.dtype, torch.Tensor] = {}
        self.ref: Any = None  # the latest version in the object store (None: not put yet)

    def version(self) -> int:
        return self._version

    def read(self, newer_than: int, timeout: float) -> None:
        raise TypeError("the trainer's end of the weight channel is write-only")

    def publish(self, params: Mapping[str, torch.Tensor], version: int) -> float:
        t0 = time.perf_counter()
        nccl = self.broadcasting and dist.get_backend() == "nccl"
        device = next(iter(params.values())).device if nccl else "cpu"
        self._flats = self.layout.flatten(params, device)
        self._version, self.ref = version, None
        if self.broadcasting:
            try:
                self._broadcast(version)
            except (RuntimeError, RayActorError, RemoteTimeout) as e:
                self.fall_back(f"broadcast of v{version} failed: {e}")
        if not self.broadcasting:
            self.offer_all()
        return time.perf_counter() - t0

    def latest(self) -> list[Any]:
        """[ref] of the latest version in the object store (put now if only broadcast)."""
        if self.ref is None:
            arrays = {dt: f.cpu().numpy() for dt, f in self._flats.items()}
            self.ref = ray.put(arrays)
        return [self.ref]

    def offer_all(self) -> None:
        """Tell every sampler the latest version's ref (fire and forget: a dead one's call just
        fails; the restarted one gets the ref with its `run`)."""
        box = self.latest()
        for a in self.actors:
            a.offer.remote(self._version, box)

    def _broadcast(self, version: int) -> None:
        """Every sampler receives `version` in buckets (runtime.buckets), each collective under
        `call_timeout_s`; a sampler that fails or stalls is named in the error."""
        refs = [a.recv_broadcast.remote(version) for a in self.actors]
        flats = self._flats
        if dist.get_backend() == "nccl":  # NCCL moves CUDA tensors only (flattened there)
            flats = {k: v if v.is_cuda else v.cuda() for k, v in flats.items()}
        try:
            broadcast_buckets(flats, self.call_timeout_s, f"trainer: broadcast of v{version}")
        except CollectiveTimeout as e:
            failed = [f"sampler {i}" for i, r in enumerate(refs) if _failed(r)]
            raise CollectiveTimeout(f"{e} (failed: {', '.join(failed) or 'none yet'})") from None
        for i, ref in enumerate(refs):
            get(ref, self.call_timeout_s, f"sampler {i}: broadcast of v{version}")

    def fall_back(self, why: str) -> None:
        if self.broadcasting:
            self.broadcasting = False
            self.fallbacks += 1
            warnings.warn(
                f"ray runtime: weights through the object store from now on ({why})", stacklevel=2
            )
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
            if self._version >= 0:
                self.offer_all()
