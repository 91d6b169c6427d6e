"""The synchronous loop: draw, generate, score, advantages, train, repeat. One screen.

Consumes prompts; produces one optimizer step per iteration; waits for the whole batch of
generations (the straggler wait that the other schedules remove). The engine shares the
trainer's model object, so a new version reaches it with no copy. What happens between
generation and the trainer (filters, overlong, replay, dynamic sampling, group sizes) is in
`Run.collect` and `Run.settle`.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from slipstream.config import Config, ConfigError
from slipstream.engine.stats import PASS_SUMS
from slipstream.observe.clock import EVAL_S, EVAL_START_S
from slipstream.observe.rollouts import STEP_MARK
from slipstream.run.setup import COUNTERS, Run, setup
from slipstream.schedule.agentic import episode_metrics
from slipstream.schedule.step_stats import goodput, prompt_len_mean
from slipstream.schedule.watchdog import Watchdog, inprocess_rollback, make_watchdog
from slipstream.tasks.rewards import part_means
from slipstream.train.checkpoint import (
    list_checkpoints,
    load_trainer_state,
    load_weights,
    save_checkpoint,
)
from slipstream.train.precision import parse_dtype
from slipstream.types import Group


def train_sync(cfg: Config, resume: bool = False) -> dict[str, Any]:
    """Train `cfg.run.steps` steps; with `resume`, continue the run in `cfg.run.dir` from its
    newest complete checkpoint (the same trajectory as an unbroken run, bit for bit)."""
    ckpt = latest_checkpoint(cfg.run.dir) if resume else None
    if ckpt is not None:
        rewind(ckpt)
    run = setup(cfg)
    try:
        return _train_steps(cfg, run, ckpt)
    except BaseException:  # an error or Ctrl-C: what `train_async` leaves, the same way
        run.close_observers()  # the terminal restored; metrics and timeline up to the last step
        # every group generated and neither trained nor filtered was back, not trained
        run.ledger.in_flight = run.ledger.generated - run.ledger.settled()
        run.write_ledger()
        raise
    finally:  # also when it raises: an in-process caller (a notebook) keeps no worker processes
        run.close_workers()


def _train_steps(cfg: Config, run: Run, ckpt: Path | None) -> dict[str, Any]:
    """`train_sync`'s loop on the run set up, from `ckpt` if given, to its summary."""
    wd = make_watchdog(run)  # before `restore`, which puts its state back
    if wd is not None:
        wd.rollback = inprocess_rollback(run)
    saved = restore(run, ckpt) if ckpt is not None else {}
    t_start = time.perf_counter() - saved.get("wall_s", 0.0)
    run.timeline.origin = t_start  # timeline seconds match the metrics' wall_s
    acc_start = saved.get("heldout_acc_start")
    start_eval: dict[str, float] = {}  # the first record's, when the run evaluates at its start
    if acc_start is None:
        t_eval = time.perf_counter()
        acc_start = run.evaluate()
        start_eval[EVAL_START_S] = time.perf_counter() - t_eval
    acc = saved.get("heldout_acc", acc_start)
    held = f"; held-out accuracy at start {acc_start:.3f}" if run.heldout else "; no held-out rows"
    run.view.log(f"run folder {run.dir}{held}")
    empty_draws = 0
    mark, groups = marks(run), []  # counters at the last step record, groups generated since
    while run.trainer.version < cfg.run.steps:
        t0 = time.perf_counter()
        # 1. draw B prompts, sample a group of each (waits for the longest one) and settle it:
        # advantages and filters; groups with no signal go to the ledger, not the trainer
        new, kept = run.collect(cfg.trainer.batch_prompts)
        groups += new
        t_gen = time.perf_counter() - t0
        run.timeline.interval("sampler0", "generate", t0 - t_start, t0 - t_start + t_gen)
        run.timeline.interval("trainer", "wait", t0 - t_start, t0 - t_start + t_gen)
        if not kept:
            if wd is not None and wd.observe_empty(new, run.trainer.version) == "rollback":
                empty_draws = 0
                continue
            empty_draws += 1
            if empty_draws > 20:
                raise RuntimeError("20 batches in a row had no informative group: check the reward")
            continue
        empty_draws = 0
        # 2. one optimizer step; the engine samples from the new version from now on
        t1 = time.perf_counter()
        if wd is not None:
            wd.before_step()  # the learning-rate multiplier of tighten / rollback / injection
        metrics = run.trainer.step(kept)
        run.engine.version = run.eval_engine.version = run.trainer.version
        run.ledger.trained += len(kept)
        t_train = time.perf_counter() - t1
        run.timeline.interval("trainer", "train", t1 - t_start, t1 - t_start + t_train)
        step = run.trainer.version
        t_step = time.perf_counter() - t0  # evaluation is not part of the step's time
        t_eval = 0.0  # in this loop a record's wall_s holds its step's evaluation (observe.clock)
        if step % cfg.eval.every == 0 or step == cfg.run.steps:
            t2 = time.perf_counter()
            with run.timeline.span("trainer", "eval"):
                acc = run.evaluate()
                if run.heldout:  # no held-out rows: no heldout_acc (eval.sets still scored)
                    metrics["heldout_acc"] = acc
                metrics.update(run.eval_metrics)  # heldout/pass@1, heldout/mean@n, sets
            t_eval = time.perf_counter() - t2
        record = step_record(run, groups, metrics, mark, t_gen, t_train, t_step, t_start)
        record |= {EVAL_S: t_eval, **start_eval}
        start_eval = {}
        observe_step(run, wd, record, groups, eval_in_wall=True)
        if ends_on_restored_weights(run, record):
            acc = run.evaluate()
        run.sink.write(record)
        run.rollouts.write(step, groups)
        run.view.update(step, record)
        mark, groups = marks(run), []
        if checkpoint_due(run, wd, step):
            checkpoint(
                run,
                heldout_acc_start=acc_start,
                heldout_acc=acc,
                wall_s=time.perf_counter() - t_start,
            )
    return finish(run, acc_start, acc, time.perf_counter() - t_start)


def marks(run: Run) -> dict[str, float]:
    """Engine and settling counters now; a step record reports the change since its mark, so
    generation of batches that trained nothing is counted in the next record."""
    return {**run.engine.stats.snapshot(), **{k: run.counters[k] for k in COUNTERS}}


def step_record(
    run: Run, groups: list[Group], metrics, mark, t_gen, t_train, t_step, t_start
) -> dict[str, Any]:
    now = marks(run)
    d = {k: now[k] - mark[k] for k in now}
    lens = [s.num_tokens for g in groups for s in g.samples]
    rewards = [s.reward for g in groups for s in g.samples]
    gen_tokens = d["tokens_generated"]
    return {
        "step": run.trainer.version,
        "version": run.trainer.version,
        "wall_s": time.perf_counter() - t_start,
        "step_time_s": t_step,
        "reward_mean": sum(rewards) / len(rewards),
        **part_means(groups),  # reward/<name> of each reward function (tasks.rewards)
        **metrics,
        "time/generate_s": t_gen,
        "time/train_s": t_train,
        "tokens/generated": gen_tokens,
        **{k: d[k] for k in COUNTERS},  # tokens/wasted, replay/samples, filters/...
        "engine/tokens_per_s": gen_tokens / max(t_gen, 1e-9),
        "train/tokens_per_s": metrics["tokens/trained"] / max(t_train, 1e-9),
        "engine/decode_steps": d["decode_steps"],
        "engine/prefill_tokens": d["prefill_tokens"],
        **{f"engine/{k}": d[k] for k in PASS_SUMS},
        "sampler_busy": t_gen / max(t_step, 1e-9),
        # the engine's forwards over the step: below sampler_busy when episodes wait for tools
        "engine/busy_frac": (d["prefill_s"] + d["decode_s"]) / max(t_step, 1e-9),
        "completion_len_mean": sum(lens) / len(lens),
        "completion_len_max": max(lens),
        "completion_lens": lens,
        "prompt_len_mean": prompt_len_mean(groups),
        **run.ledger.flat(),
        **episode_metrics(groups),
    }


def observe_step(
    run: Run,
    wd: Watchdog | None,
    record: dict[str, Any],
    groups: list[Group],
    eval_in_wall: bool,
) -> None:
    """A step's record before it is written: the watchdog sees it (and may roll back: the
    version then moves on by one), the duration forecast adds `forecast/*` to it.
    `eval_in_wall`: the record's `wall_s` holds its step's evaluation (this loop), or the
    evaluation comes after it (the orchestrated loops; observe.clock)."""
    if wd is not None:
        wd.observe(record, groups)
        run.info["watchdog"] = wd.summary()
    if run.forecast is not None:  # forecast/remaining_s and its interval
        record |= run.forecast.observe(record, eval_in_wall)


def ends_on_restored_weights(run: Run, record: dict[str, Any]) -> bool:
    """The watchdog rolled back at this step and the run has no step left (an orchestrated
    rollback moves the version on by one): the run ends on the restored weights, which the
    step's evaluation, made before the rollback, did not measure. Logs it."""
    if record.get("watchdog/action") != "rollback" or run.trainer.version < run.cfg.run.steps:
        return False
    run.view.log("watchdog: the run ends on the restored weights; evaluating them")
    return True


def checkpoint_due(run: Run, wd: Watchdog | None, step: int) -> bool:
    """Every `checkpoint.every` steps and at the last, unless the watchdog holds checkpoints
    back (an alarm may still roll back to one before it) before the last step. The last is
    the step after which the version count reached `run.steps`: an orchestrated rollback
    moves it on by one, so a rollback at the step before the last ends the run there."""
    cfg = run.cfg
    last = step == cfg.run.steps or run.trainer.version >= cfg.run.steps
    held = wd is not None and wd.hold_checkpoint() and not last
    return (step % cfg.checkpoint.every == 0 or last) and not held


def checkpoint(run: Run, **extra: Any) -> None:
    """Everything the loop's future depends on; `restore` puts it back. `extra`: the loop's
    own numbers (held-out accuracy at the start, elapsed time), JSON values."""
    state = {
        "version": run.trainer.version,
        "source": run.source.state_dict(),
        "draws": run.draws,  # the seed counter of sampling
        "ledger": run.ledger.as_dict(),
        "pass_rates": run.pass_rates.state_dict(),
        "replay": run.replay.state_dict() if run.replay is not None else None,
        "counters": dict(run.counters),
        "prompts_skipped": dict(run.prompts_skipped),
        "rng_python": random.getstate(),
        "rng_run": run.rng.getstate(),  # replay's choices
        "watchdog": run.watchdog.state_dict() if run.watchdog is not None else None,
        "forecast": run.forecast.state_dict() if run.forecast is not None else None,
        **extra,
    }
    trainer_state = {**run.trainer.state_dict(), "rng_torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        trainer_state["rng_cuda"] = torch.cuda.get_rng_state_all()
    save_checkpoint(
        run.dir,
        run.trainer.version,
        run.model,
        run.tok,
        trainer_state,
        state,
        run.cfg.checkpoint.keep,
        dtype=parse_dtype(run.cfg.model.dtype),
        protect=run.keep_steps() if run.keep_steps is not None else (),
    )


def latest_checkpoint(run_dir: str | Path | None) -> Path:
    """The newest complete checkpoint of a run folder; `ConfigError` if there is none."""
    ckpts = list_checkpoints(run_dir or ".")
    if not ckpts:
        raise ConfigError(
            f"{run_dir}: no checkpoint to resume from (expected checkpoints/step_NNNNNN)"
        )
    return ckpts[-1]


def rewind(ckpt: Path) -> None:
    """Before resuming from `ckpt`: drop what the killed run wrote after it (metrics records,
    rollouts and timeline intervals of later steps), so the resumed run does not repeat them."""
    run_dir, step = ckpt.parent.parent, int(ckpt.name.removeprefix("step_"))
    truncate_metrics(run_dir / "metrics.jsonl", step)
    rollouts = run_dir / "rollouts.txt"
    if rollouts.exists():
        text = rollouts.read_text(encoding="utf-8")
        cut = text.find(f"{STEP_MARK}{step + 1} ")
        if cut >= 0:
            rollouts.write_text(text[:cut], encoding="utf-8")
    wall = json.loads((ckpt / "state.json").read_text()).get("wall_s")
    timeline = run_dir / "timeline.jsonl"
    if wall is not None and timeline.exists():
        keep = []
        for line in timeline.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line)["t0"] <= wall:
                    keep.append(line + "\n")
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a torn last line
        timeline.write_text("".join(keep), encoding="utf-8")


def truncate_metrics(path: Path, step: int) -> None:
    """Drop records after `step` (and a torn last line), written by a run killed after its
    checkpoint, so that the resumed run's records do not repeat them."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not (isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] > step):
            keep.append(line + "\n")
    path.write_text("".join(keep), encoding="utf-8")


def restore(run: Run, ckpt: Path) -> dict[str, Any]:
    """Load a checkpoint into a freshly set-up run; returns its state.json (the loop's extras)."""
    state = json.loads((ckpt / "state.json").read_text())
    load_weights(run.model, ckpt / "model")
    trainer_state = load_trainer_state(ckpt)
    run.trainer.load_state_dict(trainer_state)
    run.engine.version = run.eval_engine.version = run.trainer.version
    run.source.load_state_dict(state["source"])
    run.draws = state["draws"]
    run.ledger.load(state["ledger"])
    run.pass_rates.load_state_dict(state["pass_rates"])
    if run.replay is not None and state.get("replay") is not None:
        run.replay.load_state_dict(state["replay"])
    run.counters.update(state.get("counters", {}))
    if run.watchdog is not None and state.get("watchdog") is not None:
        run.watchdog.load_state_dict(state["watchdog"])
    run.prompts_skipped.update(state.get("prompts_skipped", {}))
    if run.forecast is not None:  # the steps before the resume (rewound to the checkpoint)
        run.forecast.resume(read_records(run.dir / "metrics.jsonl"), state.get("forecast"))
    if "rng_python" in state:
        version, internal, gauss = state["rng_python"]
        random.setstate((version, tuple(internal), gauss))
        version, internal, gauss = state["rng_run"]
        run.rng.setstate((version, tuple(internal), gauss))
    if "rng_torch" in trainer_state:
        torch.set_rng_state(trainer_state["rng_torch"])
    if "rng_cuda" in trainer_state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(trainer_state["rng_cuda"])
    run.view.log(f"resumed from {ckpt} (step {run.trainer.version})")
    return state


def read_records(path: Path) -> list[dict[str, Any]]:
    """The step records of a metrics.jsonl (a torn last line skipped)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            out.append(rec)
    return out


def finish(run: Run, acc_start: float, acc_end: float, wall: float) -> dict[str, Any]:
    run.close_workers()
    run.close_observers()
    samplers = run.info.get("samplers", 0)
    records = read_records(run.dir / "metrics.jsonl")
    info = run.info
    totals = (info["tokens_generated"], info["busy_s"]) if "busy_s" in info else None
    good = goodput(
        records,
        wall,
        samplers,
        info.get("tokens_lost", 0),
        info.get("tokens_unfinished", 0),
        totals,
    )
    summary = {
        "heldout_acc_start": acc_start if run.heldout else None,  # None: no held-out rows
        "heldout_acc_end": acc_end if run.heldout else None,
        "wall_s": wall,
        "steps": run.trainer.version,
        "skipped_steps": run.trainer.skipped_steps,
        "ledger": run.ledger.as_dict(),
        "prompts_skipped": dict(run.prompts_skipped),
        **run.info,
        **good,
    }
    (run.dir / "summary.json").write_text(json.dumps(summary, indent=2))
    run.write_ledger()
    lost = (
        f", {run.ledger.lost} groups ({good['tokens_lost']} tokens) lost to failures"
        if run.ledger.lost
        else ""
    )
    run.view.log(
        f"done: {summary['steps']} steps in {wall:.0f}s; held-out accuracy {acc_start:.3f} -> {acc_end:.3f}; "
        f"goodput {good['goodput']:.0%}{lost}; ledger {run.ledger.as_dict()}"
    )
    return summary
