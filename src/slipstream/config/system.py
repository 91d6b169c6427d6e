"""Config sections of how a run is laid out and kept: run, schedule, runtime, checkpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from slipstream.config.base import _check_name, _Section, check_device_name
from slipstream.schedule.presets import PRESETS

Sink = Literal["jsonl", "tensorboard", "wandb"]


class RunConfig(_Section):
    dir: str | None = None
    """Run folder (metrics, checkpoints, summary). Default: runs/<UTC timestamp>."""
    seed: int = 0
    """Seed of everything random: prompt order, sampling, initialisation."""
    steps: int = Field(200, ge=1)
    """Optimizer steps (policy versions) to train."""
    quiet: bool = False
    """No live display: one plain line per evaluation, for logs and CI."""
    threads: int = Field(0, ge=0)
    """torch intra-op threads; 0 uses every core."""
    sinks: list[Sink] = Field(default_factory=lambda: list[Sink](["jsonl"]))
    """Metrics sinks; JSONL is always written. tensorboard -> RUN_DIR/tensorboard; wandb as the
    `[wandb]` section says (offline by default: upload later with `wandb sync`)."""
    rollouts_per_step: int = Field(4, ge=0)
    """Samples per step written as text to rollouts.txt (best and worst of a few groups)."""
    record_schedule: bool = False
    """Write the order of events that decided the run's outcome to RUN_DIR/schedule/ (every
    request, every engine step's admissions and weight load, every message the trainer took,
    every call into the trainer), so that `slipstream replay RUN_DIR` re-executes the run in
    one process to the same metrics and final weights (schedule/record.py). Orchestrated
    runs (`runtime.kind` local or ray) without environments, restarts or fault injection."""


class ScheduleConfig(_Section):
    name: str = "sync"
    """One of sync, tail_batching, double_buffer, async, pipeline."""
    max_lag: int | Literal["auto"] | None = None
    """K, the largest lag the trainer accepts; None uses the preset's. `auto`: the
    orchestrator tunes K between `max_lag_min` and `max_lag_max` at window boundaries
    (schedule.auto_lag; docs/algorithms.md, "Self-tuning staleness bound"): up while the
    trainer waits for data and the token ESS stays above `ess_target` (+ a margin), doubling
    until the first decrease and by one after it, each raise kept only if it sped the
    trainer by `auto_min_gain`; halved when the ESS falls below it or `mismatch/kl` exceeds
    `auto_kl_limit`. A raise needs no such test while the bound drops at least
    `auto_stale_share` of the groups generated."""
    ess_target: float = Field(0.8, gt=0.0, le=1.0)
    """`auto`: the token ESS (staleness/ess_token) the trained data must keep."""
    max_lag_min: int = Field(0, ge=0)
    """`auto`: the smallest K."""
    max_lag_max: int = Field(8, ge=0)
    """`auto`: the largest K (it also sizes the queues and the samplers' abort bound)."""
    auto_start: int = Field(1, ge=0)
    """`auto`: the K of the first window (clamped to [max_lag_min, max_lag_max]). A start at 4
    was measured at stop 57 and not kept (docs/algorithms.md, "Where the climb starts")."""
    auto_kl_limit: float = Field(0.0, ge=0.0)
    """`auto`: lower K when `mismatch/kl` (averaged over windows) exceeds this; 0: off."""
    auto_margin: float = Field(0.03, ge=0.0, lt=1.0)
    """`auto`: raise K only while the ESS is at least `ess_target` + this (hysteresis)."""
    auto_wait_min: float = Field(0.05, ge=0.0, le=1.0)
    """`auto`: raise K only while the trainer waits for data at least this share of a step."""
    auto_patience: int = Field(2, ge=1)
    """`auto`: windows measured under a K before it may change again; a decrease also needs
    the ESS (or KL) past its limit in this many of the last `auto_patience + 1` windows."""
    auto_min_gain: float = Field(0.1, ge=0.0)
    """`auto`: a raise of K is kept only if it sped the trainer (its share of time training,
    not waiting for data) by at least this fraction over `auto_probe_windows` windows; else
    the climb ends at that K, which holds (only the ESS or KL lower K). 0: no such test (K
    climbs while the trainer waits)."""
    auto_probe_windows: int = Field(8, ge=1)
    """`auto`: windows before and after a raise that `auto_min_gain` compares."""
    auto_stale_share: float = Field(0.05, ge=0.0, le=1.0)
    """`auto`: while the bound drops at least this share of the groups the samplers
    generate (ledger `stale` and `aborted`, on the average and in `auto_patience` of the last
    `auto_patience + 1` windows), a raise of K is not a probe: the dropped work is its
    measured gain, and it comes `auto_patience` windows after the last change instead of
    `auto_probe_windows`. 0: off (every raise is a probe)."""
    min_lag: int = Field(0, ge=0)
    """For measurement: hold every finished group back until the trainer is exactly this many
    versions past its oldest token's version (or, in the first steps, as far as it has come),
    so that staleness and its correction can be studied on a fast task. Needs continuous
    batching (`async`, `pipeline`) and `max_lag` >= `min_lag`. 0: off."""
    lag_policy: Literal["drop", "abort", "keep"] = "drop"
    """A group whose oldest token is more than K versions behind the trainer: `drop` it when
    it arrives (ledger: stale), `abort` it in the sampler as soon as it crosses the bound
    (ledger: aborted; arrivals still beyond K are dropped), or `keep` it and train on it with
    the importance-ratio correction of the loss (its lag then exceeds K)."""
    redundant: int = Field(0, ge=0)
    """r: start G + r samples of each group, keep the first G to finish and cancel the rest
    (RollArt). Cuts the wait for stragglers, costs the cancelled tokens (`tokens/cancelled`),
    and biases groups toward short completions: the G kept are the fastest, not a random G."""
    tail_pool: int = Field(4, ge=1)
    """tail_batching: prompts are drawn this many batches at a time and issued sorted by
    expected completion length, so short prompts share a batch and long ones another."""

    @model_validator(mode="after")
    def _known(self) -> ScheduleConfig:
        _check_name("schedule.name", self.name, PRESETS)
        return self

    @property
    def lag_bound(self) -> int | None:
        """The largest K the run can have: `max_lag_max` under `auto`, else `max_lag`."""
        return self.max_lag_max if self.max_lag == "auto" else self.max_lag

    @model_validator(mode="after")
    def _auto_lag(self) -> ScheduleConfig:
        if self.max_lag_min > self.max_lag_max:
            raise ValueError(
                f"schedule.max_lag_min: must be at most schedule.max_lag_max ({self.max_lag_max}), "
                f"got {self.max_lag_min}"
            )
        if isinstance(self.max_lag, int) and self.max_lag < 0:
            raise ValueError(f"schedule.max_lag: must be >= 0 or 'auto', got {self.max_lag}")
        if self.max_lag == "auto" and self.name in ("sync", "tail_batching"):
            raise ValueError(
                f"schedule.max_lag: 'auto' needs a schedule with lag, not {self.name!r}"
            )
        return self

    @model_validator(mode="after")
    def _lag_allowed(self) -> ScheduleConfig:
        if self.lag_bound is not None and self.name in PRESETS:
            try:
                PRESETS[self.name].with_max_lag(self.lag_bound)
            except ValueError as e:
                raise ValueError(f"schedule.max_lag: {e}") from None
        if self.min_lag and self.name in PRESETS:
            spec = PRESETS[self.name]
            k = self.max_lag_min if self.max_lag == "auto" else self.max_lag
            spec = spec if k is None else spec.with_max_lag(k)
            if spec.batching != "continuous":
                raise ValueError(
                    f"schedule.min_lag: needs a continuous-batching schedule (async, pipeline), "
                    f"not {self.name!r}"
                )
            if spec.max_lag < self.min_lag:
                raise ValueError(
                    f"schedule.min_lag: must be at most the max lag ({spec.max_lag}), "
                    f"got {self.min_lag}; raise schedule.max_lag"
                )
        return self


class RuntimeConfig(_Section):
    kind: Literal["inprocess", "local", "ray"] = "inprocess"
    """`inprocess`: the synchronous loop in one process (schedule `sync`; the other schedules
    always run on `local`). `local`: one trainer process and `num_samplers` sampler processes.
    `ray`: the same trainer and samplers as Ray actors, on this machine or a cluster."""
    address: str | None = None
    """Ray only: the cluster to join (`auto`: the one `ray start` runs on this node,
    `HOST:6379`, `ray://HOST:10001`). None starts a private Ray on this machine (all its cores,
    no dashboard, loopback only) and stops it after the run."""
    weight_transport: Literal["object_store", "broadcast"] = "object_store"
    """Ray only: how published weights reach the samplers. `object_store`: one `ray.put` per
    publish, each sampler fetches the latest when it loads. `broadcast`: a torch.distributed
    broadcast from the trainer (rank 0) to every sampler (gloo on CPU, NCCL with CUDA); the
    first weights, a restarted sampler and every publish after a sampler died go through the
    object store (a broadcast group cannot take a new member)."""
    call_timeout_s: float = Field(60.0, gt=0.0)
    """Ray only: the longest wait for any remote call beyond its own timeout (a queue put or
    get, a weight fetch, a sampler's answer to a ping); longer is an error naming the actor."""
    trainer_actor: bool = True
    """Ray only: host the trainer (orchestrator, model, optimizer, run folder writes) in a Ray
    actor, placed by `trainer_resources`, so the driver can be a laptop. False: the trainer
    runs in the driver process."""
    trainer_resources: dict[str, float] = Field(default_factory=dict)
    """Ray only: resources the trainer actor asks for (`{GPU = 1}`; `CPU`, `GPU`, custom).
    Empty: none, so it fits anywhere (on one machine). A fraction of a GPU (`{GPU = 0.5}`)
    also sizes its evaluation engine within that fraction (`engine.memory_fraction`)."""
    sampler_resources: dict[str, float] = Field(default_factory=dict)
    """Ray only: resources each sampler actor asks for; on a cluster, `{GPU = 1}` spreads the
    samplers one per GPU, `{GPU = 0.5}` puts two on each and each engine sizes itself within
    its half (`engine.memory_fraction`). Empty: none."""
    num_samplers: int = Field(1, ge=1)
    """Sampler processes (local runtime) or actors (Ray)."""
    sampler_devices: Literal["auto"] | list[str] = "auto"
    """One device per sampler (`cpu`, `cuda:N`), or `auto`: the trainer's device kind, spread
    over the GPUs the trainer does not use; on one GPU, colocated with the trainer
    (runtime.placement). Each sampler process sees only its own GPU."""
    threads_per_sampler: int = Field(0, ge=0)
    """torch threads in each sampler process; 0 splits the cores between the trainer and the
    samplers (at least 1 each)."""
    trainer_threads: int = Field(0, ge=0)
    """torch threads in the trainer process; 0 splits the cores as above."""
    sampler_slots: int = Field(0, ge=0)
    """Sequences each sampler's engine decodes at once; 0: B x (G + r)."""
    queue_size: int = Field(0, ge=0)
    """Bound of the queue of finished groups; 0: 2 x B. A full queue blocks the samplers."""
    poll_s: float = Field(0.05, gt=0.0, le=5.0)
    """Longest single wait on a queue; stop requests are noticed within it."""
    startup_timeout_s: float = Field(600.0, gt=0.0)
    """Samplers must be built and holding the first weights within this time."""
    stall_timeout_s: float = Field(600.0, gt=0.0)
    """Fail if no group arrives for this long while groups are in flight."""
    shutdown_timeout_s: float = Field(10.0, gt=0.0)
    """Wait this long for samplers to exit before terminating them."""
    max_restarts: int = Field(3, ge=0)
    """A sampler that dies (killed, crashed) is restarted with the latest weights at most this
    many times; its in-flight prompts are issued again and counted `lost` in the ledger."""
    max_request_retries: int = Field(2, ge=0)
    """A prompt request lost with a dying sampler is issued again at most this many times;
    lost once more, it is dropped (ledger: `poisoned`) with a warning naming its prompt, so a
    prompt that crashes its sampler every time costs one group, not the run's `max_restarts`."""
    sampler_timeout_s: float = Field(300.0, gt=0.0)
    """A sampler holding work that sends nothing (not even its counters, sent every 0.5 s
    while busy) for this long is killed and restarted."""
    chaos_kills: int = Field(0, ge=0)
    """Fault injection, to test recovery on your own setup: SIGKILL a random sampler (one that
    holds work, if any does) this many times during the run, one every `chaos_every_s` seconds
    (set `max_restarts` to match)."""
    chaos_every_s: float = Field(5.0, gt=0.0)
    """Seconds between injected sampler kills."""
    defer_eval: bool = False
    """Snapshot the weights at evaluation steps and evaluate them after the run, so that
    evaluation takes no time from training (benchmarks: time to a target accuracy). The
    snapshots are files in `<run.dir>/eval_snapshots/`, deleted once scored. Orchestrated
    runtimes only (`local`, `ray`, or any schedule but the in-process `sync`)."""

    @model_validator(mode="after")
    def _devices(self) -> RuntimeConfig:
        if isinstance(self.sampler_devices, list):
            for i, d in enumerate(self.sampler_devices):
                try:
                    check_device_name(d)
                except ValueError as e:
                    raise ValueError(f"runtime.sampler_devices[{i}]: {e}") from None
        return self

    @model_validator(mode="after")
    def _resources(self) -> RuntimeConfig:
        for key in ("trainer_resources", "sampler_resources"):
            for name, amount in getattr(self, key).items():
                if amount < 0:
                    raise ValueError(f"{key}.{name}: must be >= 0, got {amount}")
        return self


class EngineConfig(_Section):
    memory_fraction: float = Field(0.0, ge=0.0, le=0.95)
    """On a GPU: the share of the device's free memory (measured once the model is loaded)
    the engines on it may take together: their KV caches, the logits their CUDA graphs keep
    (one `[slots, vocabulary]` buffer per span bucket) and nothing else, once each engine's
    packed copy of the weights (about the model's size again) is set aside (engine.capacity).
    Engines sharing a GPU split it (runtime.placement.memory_share): evenly on the local
    runtime (its samplers there, and the trainer's evaluation engine on its own), and on Ray
    by the fraction of a GPU each actor asked for (`GPU = 0.5` in `runtime.sampler_resources`
    or `trainer_resources`: half of it). Unlike vLLM's `gpu_memory_utilization` (each
    instance's own fraction of the total memory, lowered by hand when instances share a GPU)
    it is the whole GPU's. It bounds how many sequences run at once (`runtime.sampler_slots`
    is then an upper bound). Colocated with the trainer, leave the trainer room (0.3-0.5).
    0: no memory bound."""
    max_tokens: int = Field(0, ge=0)
    """The KV cache's tokens, all slots together (wins over `memory_fraction`). 0: no bound
    beyond `memory_fraction`; on the CPU, slots x the longest sequence."""
    max_len: int = Field(0, ge=0)
    """Longest sequence (prompt + completion) the engine holds; a prompt that cannot fit
    with `sampling.max_new_tokens` is skipped before generation and counted
    (`prompts/skipped_too_long`). 0: the longest prompt of the task plus max_new_tokens,
    at most the model's `max_position_embeddings`."""


class CheckpointConfig(_Section):
    every: int = Field(50, ge=1)
    """Save a checkpoint (HF folder + optimizer state) every this many steps and at the end."""
    keep: int = Field(2, ge=1)
    """Checkpoints kept; older ones are deleted."""
