"""The Ray runtime: the same samplers and trainer as Ray actors, on one machine or a cluster.

What runs where:

    driver (`slipstream train`, can be a laptop)   starts or joins Ray, hosts the trainer actor,
                                                   turns Ctrl-C into a stop request
    trainer actor (`TrainerHost`)                   the orchestrator and the `Run`: model,
                                                   optimizer, evaluation, run folder; this
                                                   `RayRuntime`, which owns everything below
    sampler actors (`SamplerHost`), one per id      the unchanged `SamplerWorker`, in `run`
    queue actors (`QueueActor`)                     one inbox per sampler, one shared group queue

With `runtime.trainer_actor = false` the trainer runs in the driver instead (a workstation
that holds the trainer's GPU). The run folder is written by the trainer, on its node: give
`run.dir` on a shared filesystem, or pin the trainer to the head node with
`runtime.trainer_resources`.

The channels, as `channels.py` declares them:

- prompts and groups: bounded asyncio queues in `QueueActor`s. Messages travel pickled (the
  queue actor holds bytes and never imports our types); a put into a full queue waits (back-
  pressure) up to its timeout. A remote call is delivered whole or not at all, so a sampler
  killed half-way cannot tear a message; a restarted sampler still gets a fresh inbox, since
  its old one holds requests the orchestrator has already issued again. Remote calls are the
  cost here (about 1 ms of CPU each, against a pipe write locally), so there are few: readers
  prefetch (one get always outstanding), the trainer's puts of one issuing round go in one
  call, and a busy sampler's messages in one call at most `LINGER_S` late.
- weights (`weight_transport`): `object_store`: a publish is one `ray.put` of one flat byte
  buffer per dtype and a fire-and-forget `offer(version, ref)` to every sampler; a sampler
  fetches the latest ref when it loads (zero-copy on its node). `broadcast`: the trainer
  (rank 0) broadcasts the flat buffers over torch.distributed to every sampler (a
  `recv_broadcast` call makes each one take part), gloo on CPU, NCCL with CUDA. A broadcast
  group cannot take a new member: the first weights go through the object store, and once a
  sampler has died (or a broadcast fails) every later publish does too (`fallbacks`).
- stop: a flag in each sampler actor, set by a `stop()` call; `version()` is a field there,
  so the sampler's per-step polls of the stop flag and the weight version cost no remote call.

Failures: each sampler actor has `max_restarts` (Ray restarts the process and reruns its
constructor). `check()` polls the `run` calls: one that returned a sampler's traceback raises
it (its `error` message may have found the group queue full); one that ended with
`RayActorError` is a dead sampler; `check()` gives it a fresh inbox and calls `run` again with the latest weights (it
starts as soon as Ray has restarted the process) and returns its id, so the orchestrator
issues its requests again and counts them lost. Every remote call we wait on has a timeout:
a queue call or weight fetch times out after its own timeout plus `call_timeout_s`; `check()`
pings each sampler (a ping runs beside `run`: the actors are threaded) and a sampler that
does not answer within `call_timeout_s` is stuck: `RemoteTimeout`, naming it.

Shutdown has one path, `RayRuntime.shutdown()`: set the stop flags, wait up to
`shutdown_timeout_s` for the `run` calls to return, kill every actor (no restart), leave the
broadcast group. The driver's `session` stops a Ray it started; actors belong to the process
that created them, so a trainer actor that dies takes its samplers and queues with it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import ray
import torch
import torch.distributed as dist
from ray.exceptions import ActorDiedError, RayActorError

from slipstream.config.base import ConfigError
from slipstream.runtime.buckets import broadcast_buckets
from slipstream.runtime.channels import Channels, Router, SamplerMessage, sampler_failure
from slipstream.runtime.ray_channels import (
    FlatLayout,
    RayQueue,
    RemoteTimeout,
    SamplerWeights,
    TrainerWeights,
    get,
)
from slipstream.text import first_line

LINGER_S = 0.02  # a busy sampler sends its messages at most this late (fewer, larger calls)
CHECK_EVERY_S = 0.2  # how often `check()` polls the actors (a death is noticed within it)
PING_EVERY_S = 1.0  # how often each sampler is pinged


# ---- Ray itself ---------------------------------------------------------------------------------
@contextlib.contextmanager
def session(address: str | None) -> Iterator[None]:
    """Join the cluster at `address`, or start a private Ray here (every core, no dashboard,
    loopback only); a Ray this started is stopped on the way out. Inside a Ray worker (or with
    Ray already initialised) it does nothing."""
    if ray.is_initialized():
        yield
        return
    if address:
        _join(address)
    else:
        ray.init(
            num_cpus=os.cpu_count(),
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=True,
        )
    try:
        yield
    finally:
        ray.shutdown()


def _join(address: str) -> None:
    """`ray.init` on the cluster at `address`; none to join there is a `ConfigError` naming
    `runtime.address` (Ray's own message suggests flags of its CLI, none of ours)."""
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=True)
    except ConnectionError as e:
        said = first_line(e).split(". ")[0].rstrip(".")
        raise ConfigError(
            f"runtime.address: no Ray cluster to join at {address!r} ({said}); start one with "
            "`ray start --head`, or leave runtime.address unset for a private Ray on this machine"
        ) from None


def actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    """`runtime.*_resources` as Ray actor options (`CPU`, `GPU`, anything else custom). A
    `GPU` below 1 lets Ray pack actors onto one GPU without dividing its memory: the actor's
    engine sizes itself within that fraction of it (run.components.engine_share)."""
    rest = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    opts: dict[str, Any] = {
        "num_cpus": resources.get("CPU", 0.0),
        "num_gpus": resources.get("GPU", 0.0),
    }
    if rest:
        opts["resources"] = rest
    return opts


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# ---- the actors -------------------------------------------------------------------------------
class _Stop:
    def __init__(self, event: threading.Event) -> None:
        self._event = event

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()


@ray.remote(max_concurrency=4)  # type: ignore[call-overload]  # an actor option ray's stubs lack
class SamplerHost:
    """One sampler: `run` hosts the `SamplerWorker` that `factory(sampler_id)` builds; the
    other methods run beside it on the actor's other threads."""

    def __init__(
        self,
        factory: Callable[[int], Any],
        sampler_id: int,
        threads: int,
        layout: FlatLayout,
        call_timeout_s: float,
    ) -> None:
        torch.set_num_threads(threads)
        self.factory, self.id = factory, sampler_id
        self.weights = SamplerWeights(layout, call_timeout_s)
        self.stopped = threading.Event()

    def run(
        self, inbox: RayQueue, groups: RayQueue, version: int, box: list[Any], num_samplers: int
    ) -> str:
        """The sampler loop until `stop` (then ''), or the traceback of its failure. That
        is sent on `groups` too, but may find no room there (the trainer busy): the trainer
        learns it from this result as well (`RayRuntime.check`)."""
        self.weights.offer(version, box)
        ch = Channels(inbox, groups, self.weights, _Stop(self.stopped), num_samplers)
        try:
            self.factory(self.id).run(ch)
        except Exception:
            error = traceback.format_exc()
            with contextlib.suppress(Exception):  # (a put refused earlier raises here)
                groups.put(SamplerMessage("error", self.id, error=error), 5.0)
            return error
        finally:
            groups.flush(5.0)
        return ""

    def offer(self, version: int, box: list[Any]) -> None:
        self.weights.offer(version, box)

    def join_group(
        self, init_method: str, rank: int, world: int, backend: str, timeout_s: float
    ) -> None:
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world,
            timeout=dt.timedelta(seconds=timeout_s),
        )

    def recv_broadcast(self, version: int) -> None:
        """Take part in the broadcast of `version`: buckets received in place into fresh
        buffers on this actor's GPU (NCCL) or the CPU (gloo), each under
        `call_timeout_s`; with NCCL they stay on the GPU for the engine to copy from."""
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flats = self.weights.layout.empty(device)  # fresh: readers may hold the last one
        what = f"sampler {self.id}: broadcast of v{version}"
        broadcast_buckets(flats, self.weights.call_timeout_s, what)
        self.weights.offer(version, flats)

    def stop(self) -> None:
        self.stopped.set()

    def ping(self) -> int:
        return os.getpid()


@ray.remote(max_concurrency=2, max_restarts=0)  # type: ignore[call-overload]
class TrainerHost:
    """Hosts the trainer: `call(fn, args, kwargs)` runs it with a stop flag (`Interrupts`-like: an
    object with `requested`) as its keyword `signals`; `stop` sets the flag from the driver."""

    def __init__(self, signals: Any) -> None:
        self.signals = signals

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return fn(*args, signals=self.signals, **kwargs)

    def stop(self, signum: int) -> None:
        self.signals.requested = signum


def host_trainer(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    signals: Any,
    resources: Mapping[str, float],
    stop_timeout_s: float,
) -> Any:
    """Run `fn(*args, signals=..., **kwargs)` in a trainer actor and return its result.
    Ctrl-C or SIGTERM here asks the trainer to stop at its next safe point (its runtime's one
    shutdown path, ledger written), waits `stop_timeout_s` for that, kills it, and raises
    `KeyboardInterrupt`; a second signal skips the wait."""
    from slipstream.runtime.local import Interrupts

    host = TrainerHost.options(**actor_options(resources)).remote(signals)  # type: ignore[attr-defined]
    ref = host.call.remote(fn, args, kwargs)
    here = Interrupts()
    try:
        with here.catch():
            while True:  # the run's own stall timeouts bound it; polling sees a signal
                ready, _ = ray.wait([ref], timeout=0.5)
                if ready:
                    return ray.get(ref)
                if here.requested is not None:
                    host.stop.remote(here.requested)
                    with contextlib.suppress(Exception):
                        ray.get(ref, timeout=stop_timeout_s)
                    here.raise_if_requested()
    finally:
        ray.kill(host, no_restart=True)


# ---- the runtime ------------------------------------------------------------------------------
class RayRuntime:
    """Implements `channels.Runtime` with Ray actors (module docstring). Arguments as
    `LocalRuntime`'s, plus the weight transport, `call_timeout_s` and the sampler actors'
    resources. Construct it inside a Ray session."""

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        num_samplers: int,
        threads_per_sampler: int,
        prompt_queue: int,
        group_queue: int,
        shutdown_timeout_s: float = 10.0,
        max_restarts: int = 3,
        weight_transport: str = "object_store",
        call_timeout_s: float = 60.0,
        sampler_resources: Mapping[str, float] | None = None,
        startup_timeout_s: float = 600.0,
    ) -> None:
        self.num_samplers, self.threads = num_samplers, threads_per_sampler
        self.startup_timeout_s = startup_timeout_s
        self.prompt_queue, self.call_timeout_s = prompt_queue, call_timeout_s
        self.shutdown_timeout_s, self.max_restarts = shutdown_timeout_s, max_restarts
        self.resources = dict(sampler_resources or {})
        self.inboxes = [self._inbox(i) for i in range(num_samplers)]
        self.groups = RayQueue.create("groups", group_queue, call_timeout_s)
        # the samplers' end: a sampler's messages gathered for up to LINGER_S, one call
        self.groups.window, self.groups.coalesce, self.groups.linger_s = 8, True, LINGER_S
        self.weights = TrainerWeights(params, weight_transport, call_timeout_s)
        self.stop = _Stop(threading.Event())
        self.channels = Channels(
            prompts=Router(list(self.inboxes)),
            groups=self._trainer_end(),
            weights=self.weights,
            stop=self.stop,
            num_samplers=num_samplers,
        )
        self.actors: list[Any] = []
        self.runs: list[Any] = []
        self.restarts = [0] * num_samplers
        self.exited: set[int] = set()  # `run` returned (stopped): not restarted
        self._pings: dict[int, tuple[Any, float]] = {}  # sampler -> (pending ping, sent at)
        self._back: dict[int, tuple[Any, float]] = {}  # restarting -> (pending ping, died at)
        self._pids: list[int] = [0] * num_samplers
        self._next_check = 0.0
        self._closed = False

    def _trainer_end(self) -> RayQueue:
        """The trainer's end of the group queue: up to 32 groups per round trip, prefetched
        (they travel while the trainer trains)."""
        q = RayQueue("groups", self.groups.actor, self.call_timeout_s, batch=32)
        q.prefetch = True
        return q

    def _inbox(self, i: int) -> RayQueue:
        """Sampler i's inbox. The trainer pipelines its puts (admission control already bounds
        what is in flight, so the inbox does not fill) and gathers those of one `issue` into
        one call (`Router.push`); the sampler prefetches up to 16 chunks per round trip, so its
        per-step look at the inbox costs no round trip."""
        q = RayQueue.create(f"inbox {i}", self.prompt_queue, self.call_timeout_s)
        q.window, q.coalesce, q.batch, q.prefetch = 64, True, 16, True
        return q

    def start(self, factory: Callable[[int], Any]) -> None:
        opts = actor_options(self.resources)
        for i in range(self.num_samplers):
            self.actors.append(
                # Ray restarts it as often as it dies; `check()` holds the budget, since a
                # kill that lands while it restarts may or may not count for Ray
                SamplerHost.options(max_restarts=-1, **opts).remote(  # type: ignore[attr-defined]
                    factory, i, self.threads, self.weights.layout, self.call_timeout_s
                )
            )
            self.runs.append(self._run(i))
        self.weights.actors = self.actors
        if self.weights.transport == "broadcast":
            self._form_group()

    def _run(self, i: int) -> Any:
        return self.actors[i].run.remote(
            self.inboxes[i],
            self.groups,
            self.weights.version(),
            self.weights.latest(),
            self.num_samplers,
        )

    def _form_group(self) -> None:
        """Trainer rank 0, sampler i rank i + 1; gloo on CPU, NCCL when CUDA is there."""
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        host = ray.util.get_node_ip_address()
        init = f"tcp://{host}:{_free_port(host)}"
        world = self.num_samplers + 1
        # every actor up first (placed, imported): starting is not what call_timeout_s bounds
        pings = [a.ping.remote() for a in self.actors]
        get(pings, self.startup_timeout_s, "sampler actors starting (runtime.startup_timeout_s)")
        joins = [
            a.join_group.remote(init, i + 1, world, backend, self.call_timeout_s)
            for i, a in enumerate(self.actors)
        ]
        dist.init_process_group(
            backend,
            init_method=init,
            rank=0,
            world_size=world,
            timeout=dt.timedelta(seconds=self.call_timeout_s),
        )
        get(joins, self.call_timeout_s, "samplers joining the broadcast group")
        self.weights.broadcasting = True

    def pids(self) -> list[int]:
        return list(self._pids)

    def kill(self, i: int) -> None:
        ray.kill(self.actors[i], no_restart=False)  # a crash: Ray restarts it

    def check(self) -> list[int]:
        """Ids of samplers whose actor died since the last call (each gets a fresh inbox and,
        once Ray has restarted it, a new `run`); raise on a spent restart budget, a failure
        that escaped the sampler or that it reported, or a sampler that stops answering
        (`RemoteTimeout`)."""
        now = time.monotonic()
        if self.stop.is_set() or now < self._next_check:
            return []
        self._next_check = now + CHECK_EVERY_S
        restarted = []
        for i, ref in enumerate(self.runs):
            if i in self.exited:
                continue
            if i in self._back:
                self._come_back(i, now)
                continue
            if not ray.wait([ref], timeout=0)[0]:
                self._ping(i)
                continue
            try:
                error = get(ref, self.call_timeout_s, f"sampler {i} (run)")
            except RayActorError:
                error = None
            if error:  # as the orchestrator says it on the `error` message, which may be lost
                raise sampler_failure(i, error)
            if error is not None:  # stopped
                self.exited.add(i)
                continue
            if self.restarts[i] >= self.max_restarts:
                raise RuntimeError(
                    f"sampler actor {i} died and was already restarted {self.restarts[i]} "
                    "times (runtime.max_restarts)"
                )
            self.restarts[i] += 1
            self.weights.fall_back(f"sampler {i} died")
            router = self.channels.prompts
            assert isinstance(router, Router)
            self.inboxes[i].close()
            self.inboxes[i] = self._inbox(i)
            router.replace(i, self.inboxes[i])
            self._pings.pop(i, None)
            self._back[i] = (self.actors[i].ping.remote(), now)
            restarted.append(i)
        return restarted

    def _come_back(self, i: int, now: float) -> None:
        """Sampler `i` is being restarted by Ray: ping it until it answers, then call `run`
        (a call to a restarting actor fails at once; a `run` must start in a live one)."""
        ref, since = self._back[i]
        if not ray.wait([ref], timeout=0)[0]:
            if now - since > self.startup_timeout_s:  # a restart is a start: spawn, imports
                raise RemoteTimeout(
                    f"ray runtime: sampler {i} was not back {self.startup_timeout_s:.0f}s after "
                    "it died (runtime.startup_timeout_s)"
                )
            return
        try:
            self._pids[i] = int(ray.get(ref, timeout=0))
        except ActorDiedError as e:
            raise RuntimeError(f"sampler actor {i} died for good: {e}") from None
        except RayActorError:  # still restarting
            self._back[i] = (self.actors[i].ping.remote(), since)
            return
        del self._back[i]
        self.runs[i] = self._run(i)

    def _ping(self, i: int) -> None:
        """At most one ping in flight per sampler; one unanswered for `call_timeout_s` raises.
        A ping to a dead actor fails instead, and its `run` says it died."""
        pending = self._pings.get(i)
        now = time.monotonic()
        if pending is None:
            self._pings[i] = (self.actors[i].ping.remote(), now)
            return
        ref, sent = pending
        if ray.wait([ref], timeout=0)[0]:
            with contextlib.suppress(RayActorError):
                self._pids[i] = int(ray.get(ref, timeout=0))
            if now - sent > PING_EVERY_S:
                del self._pings[i]
        elif self._pids[i] and now - sent > self.call_timeout_s:  # (starting: wait_ready's)
            raise RemoteTimeout(
                f"ray runtime: sampler {i} (pid {self._pids[i] or '?'}) did not answer a ping "
                f"within {self.call_timeout_s:.1f}s (runtime.call_timeout_s): it is stuck"
            )

    def shutdown(self) -> None:
        """The one shutdown path (module docstring). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self.stop.set()
        for a in self.actors:
            a.stop.remote()
        if self.runs:
            ray.wait(self.runs, num_returns=len(self.runs), timeout=self.shutdown_timeout_s)
        for a in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        for q in (*self.inboxes, self.groups):
            q.close()
        if self.weights.broadcasting:
            self.weights.broadcasting = False
            with contextlib.suppress(Exception):
                dist.destroy_process_group()

    def __enter__(self) -> RayRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


__all__ = ["RayRuntime", "RemoteTimeout", "host_trainer", "session"]
