"""Launch an orchestrated run: the run, a runtime (local processes or Ray actors), the
orchestrator between them; resume from a checkpoint; one shutdown path.

`train_async(cfg)` is what `slipstream train` calls for every schedule but the in-process
`sync` loop (`run.sync.train_sync`). On Ray it first starts or joins the cluster and, by
default, runs the trainer side in a trainer actor (`runtime.trainer_actor`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from slipstream.config import Config
from slipstream.schedule.auto_lag import LagControl, lag_control, tighten_hook
from slipstream.schedule.orchestrator import Options, Orchestrator

if TYPE_CHECKING:  # imported where they are used: building them starts torch work
    from slipstream.run.learner import RunLearner
    from slipstream.run.sampler import SamplerFactory
    from slipstream.run.setup import Run
    from slipstream.runtime.channels import Runtime
    from slipstream.runtime.local import Interrupts


def train_async(
    cfg: Config, signals: Interrupts | None = None, resume: bool = False, *, checked: bool = False
) -> dict[str, Any]:
    """Train with `cfg.schedule` on the local or the Ray runtime (`runtime.kind`); the run
    folder is `run.sync.train_sync`'s: config.toml, metrics.jsonl, ledger.json, summary.json,
    timeline.jsonl, rollouts, checkpoints/. Ctrl-C, SIGTERM and errors take the runtime's one
    shutdown path, and the ledger is written either way. On Ray this starts or joins the
    cluster and (`runtime.trainer_actor`) runs the rest of this function in a trainer actor,
    whose stop flag is `signals`. With `resume`, continue from the newest checkpoint in
    `cfg.run.dir`: weights, optimizer, run state and the orchestrator's queued work, and
    `run.record_schedule` off (`_no_record`); `checked`: the caller made `check_resume`'s
    checks already (the CLI, in its own words)."""
    from slipstream.run.resume import check_resume
    from slipstream.runtime.local import Interrupts

    # (signals given: the Ray trainer actor's call, checked before it)
    if resume and signals is None and not checked:
        check_resume(cfg)
    if resume and cfg.run.record_schedule:
        _no_record(cfg)
    rc = cfg.runtime
    if rc.kind == "ray" and signals is None:
        from slipstream.run.folder import make_run_dir
        from slipstream.runtime.ray import host_trainer, session

        with session(rc.address):
            if not rc.trainer_actor:
                return train_async(cfg, Interrupts(), resume)
            # the actor's working folder may differ; a resume writes config.toml once restored
            cfg.run.dir = str(make_run_dir(cfg, config=not resume).resolve())
            return host_trainer(
                train_async,
                (cfg,),
                {"resume": resume},
                Interrupts(),
                rc.trainer_resources,
                rc.shutdown_timeout_s + 30,
            )
    return _train(cfg, signals or Interrupts(), resume)


def _train(cfg: Config, signals: Interrupts, resume: bool) -> dict[str, Any]:
    """The run in this process: build, restore, start the samplers, loop, shut down, finish."""
    from slipstream.run.resume import resume_from
    from slipstream.train.checkpoint import checkpoint_step

    ckpt = resume_from(cfg) if resume else None
    built = _build(cfg, checkpoint_step(ckpt) if ckpt is not None else None)
    try:
        return _drive(cfg, signals, ckpt, *built)
    finally:  # also when it raises: an in-process caller (a notebook) keeps no worker processes
        built[0].close_workers()  # (the trainer's own, of its evaluation episodes)


def _no_record(cfg: Config) -> None:
    """A resumed run is not recorded: a record covers a run from step 0, and the run's own is
    marked incomplete by the resume (`run.resume.void_record`). Turns `run.record_schedule`
    off (also in the config.toml the resumed run writes) and says so in one line."""
    cfg.run.record_schedule = False
    print(
        f"slipstream: warning: resuming {cfg.run.dir} without recording it "
        "(run.record_schedule off): a schedule record covers a run from step 0, so its record "
        "is marked incomplete and slipstream replay refuses it",
        file=sys.stderr,
    )


def _drive(
    cfg: Config,
    signals: Interrupts,
    ckpt: Path | None,
    run: Run,
    rt: Runtime,
    learner: RunLearner,
    orch: Orchestrator,
    sampler: SamplerFactory,
) -> dict[str, Any]:
    """`_train` on what `_build` made: restore, start the samplers, loop, shut down, finish."""
    from slipstream.run.summary import finish

    rc = cfg.runtime
    close_record = _record(cfg, run.dir, orch)
    saved = _restore(run, learner, orch, ckpt)
    acc_start = saved.get("heldout_acc_start")
    ctl = orch.lag_control if isinstance(orch.lag_control, LagControl) else None
    learner.extra_state = lambda: {
        "orchestrator": orch.state_dict(),
        "heldout_acc_start": acc_start,
        "wall_s": time.perf_counter() - orch.stats.t_start,
        "run_stats": orch.stats.state_dict(),  # the summary's run-level figures go on
        **learner.state_dict(),  # the held-out curve so far, deferred snapshots not scored
        **({"lag_control": ctl.state_dict()} if ctl is not None else {}),
    }
    orch.health = signals.raise_if_requested
    try:
        with signals.catch():
            rt.channels.weights.publish(dict(run.model.named_parameters()), run.trainer.version)
            rt.start(sampler)
            run.view.log(
                f"schedule {orch.spec.name}: {rt.num_samplers} sampler(s) on {cfg.runtime_kind}"
            )
            orch.wait_ready(cfg.runtime.startup_timeout_s)
            orch.start()
            orch.stats.t_start -= saved.get("wall_s", 0.0)  # a resumed run's clock goes on
            learner.t_start = run.timeline.origin = orch.stats.t_start
            if ckpt is None:
                acc_start = learner.evaluate(0)
            orch.stats.step_begins()  # the evaluation at the start is no step's time
            orch.run()
            wall = time.perf_counter() - orch.stats.t_start
        close_record(True)
    except BaseException:
        close_record(False)
        run.close_observers()  # leave the terminal clean; metrics written so far stay
        raise
    finally:
        rt.shutdown()
        run.info["tokens_unfinished"] = orch.settle_unfinished()
        run.write_ledger()
    learner.evaluate_deferred()
    curve = sorted(learner.curve, key=lambda c: c["step"])
    run.info.update(
        orch.summary(),
        heldout_curve=curve,
        runtime=cfg.runtime_kind,
        sampler_pids=rt.pids(),
        samplers=rt.num_samplers,
        weight_channel=type(rt.channels.weights).__name__,  # CudaIpcWeights: device to device
        placement={"trainer": run.placement.trainer, "samplers": list(run.placement.samplers)},
    )
    if torch.cuda.is_available() and run.placement.trainer != "cpu":
        run.info["trainer_peak_gib"] = (
            torch.cuda.max_memory_allocated(run.placement.trainer) / 2**30
        )
    if rc.kind == "ray":
        from slipstream.runtime.ray import RayRuntime

        assert isinstance(rt, RayRuntime)
        run.info.update(weight_transport=rc.weight_transport, weight_fallbacks=rt.weights.fallbacks)
    acc_start = curve[0]["heldout_acc"] if acc_start is None else acc_start
    summary = finish(run, acc_start, curve[-1]["heldout_acc"], wall)
    learner.drop_snapshots()
    return summary


def _restore(
    run: Run, learner: RunLearner, orch: Orchestrator, ckpt: Path | None
) -> dict[str, Any]:
    """A resumed run: the checkpoint `ckpt` into the run, the learner and the orchestrator
    (its queued work, the lag controller's state); its state.json ({} without `ckpt`)."""
    from slipstream.run.resume import restore
    from slipstream.train.checkpoint import checkpoint_step

    if ckpt is None:
        return {}
    saved = restore(run, ckpt)
    learner.restored(saved, checkpoint_step(ckpt))
    orch.stats.load_state_dict(saved.get("run_stats", {}))  # older checkpoints: none
    if "orchestrator" in saved:
        orch.load_state_dict(saved["orchestrator"])
        if run.env_factory is not None:  # episodes in flight restart from their prompt
            requests = saved["orchestrator"]["requests"]
            run.info["episodes_restarted"] = sum(len(r["seeds"]) for r in requests)
    ctl = orch.lag_control
    if isinstance(ctl, LagControl) and "lag_control" in saved:
        ctl.load_state_dict(saved["lag_control"])
        orch.spec = replace(orch.spec, max_lag=ctl.current)
    return saved


def _record(cfg: Config, run_dir: Path, orch: Orchestrator) -> Callable[[bool], None]:
    """run.record_schedule: record the run (schedule.record); the call closing the record."""
    if not cfg.run.record_schedule:
        return lambda complete: None
    from slipstream.runtime.local import default_threads
    from slipstream.schedule.record import attach

    rc = cfg.runtime
    meta = {
        "samplers": rc.num_samplers,
        "trainer_threads": rc.trainer_threads or default_threads(rc.num_samplers),
        "sampler_threads": rc.threads_per_sampler or default_threads(rc.num_samplers),
        "schedule": orch.spec.name,
        "max_lag": orch.spec.max_lag,
        "runtime": cfg.runtime_kind,
    }
    return attach(orch, run_dir, meta)


def _build(
    cfg: Config, resume_step: int | None = None
) -> tuple[Run, Runtime, RunLearner, Orchestrator, SamplerFactory]:
    """The run, the runtime (not started), the learner, the orchestrator, the samplers' factory;
    `resume_step`: the checkpoint step a resumed run goes on from (`run.setup.setup`)."""
    from slipstream.run.learner import RunLearner
    from slipstream.run.rollback import make_watchdog, orchestrated_rollback
    from slipstream.run.sampler import SamplerFactory
    from slipstream.run.setup import setup
    from slipstream.runtime import make_runtime
    from slipstream.runtime.local import default_threads
    from slipstream.schedule.presets import preset
    from slipstream.schedule.sampler import SamplerSpec
    from slipstream.train.precision import channel_layout, parse_dtype

    spec = preset(cfg.schedule.name, cfg.schedule.lag_bound)
    rc, sc = cfg.runtime, cfg.schedule
    B, G, r = cfg.trainer.batch_prompts, cfg.sampling.group_size, sc.redundant
    run = setup(cfg, resume_step)
    torch.set_num_threads(rc.trainer_threads or default_threads(rc.num_samplers))
    rt = make_runtime(
        rc,
        channel_layout(run.model, parse_dtype(cfg.model.dtype)),
        (spec.max_lag + 2) * B,
        2 * B,
        sampler_env=[run.placement.sampler_env(i) for i in range(len(run.placement.samplers))],
        weight_devices=list(run.placement.samplers),
    )
    learner = RunLearner(run, rc.defer_eval, run.timeline)
    f = cfg.filters
    opts = Options(
        B,
        G,
        cfg.run.steps,
        r,
        sc.lag_policy,
        sc.tail_pool,
        rc.poll_s,
        rc.stall_timeout_s,
        dynamic_sampling=f.dynamic_sampling,
        max_extra_draws=f.max_extra_draws,
        sampler_timeout_s=rc.sampler_timeout_s,
        max_request_retries=rc.max_request_retries,
        chaos_kills=rc.chaos_kills,
        chaos_every_s=rc.chaos_every_s,
        chaos_seed=cfg.run.seed,
        min_lag=sc.min_lag,
    )
    orch = Orchestrator(spec, opts, learner, rt.channels, timeline=run.timeline, runtime=rt)
    control = lag_control(cfg, spec.max_lag)
    if control is not None:  # K of the first window; K_max sized the queues and samplers
        orch.lag_control = control
        orch.spec = replace(spec, max_lag=control.current)
    tighten = tighten_hook(control, orch) if control is not None else None
    learner.watchdog = make_watchdog(run, tighten)
    if learner.watchdog is not None:
        learner.watchdog.rollback = orchestrated_rollback(run, learner, orch)
    dtype = parse_dtype(cfg.model.dtype)  # samplers hold the compute dtype, not the fp32 master
    slots = rc.sampler_slots or B * (G + r)
    sampler = SamplerSpec(
        cfg, run.model.config, dtype, run.tok, spec, slots, run.engine.max_len, run.placement
    )
    return run, rt, learner, orch, SamplerFactory(sampler)
