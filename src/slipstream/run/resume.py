"""Checkpoints of a run and resuming from them.

`checkpoint(run)` writes everything the loop's future depends on (weights, optimizer, the
run's counters and random states, the watchdog's and the forecast's state, the loop's own
numbers); `latest_checkpoint` finds the newest complete one of a run folder; `resume_changes`
names the settings a resume changes, and `check_queue` refuses those the checkpoint's queued
work cannot be resumed under; `rewind` drops what a killed (or stopped) run wrote after it;
`restore` puts it back into a freshly set-up run, then writes the run's config.toml. The
in-process loop (`run.sync`) and the orchestrated one (`run.launch`) both resume this way.
"""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path
from typing import Any

import torch

from slipstream.config import Config, ConfigError, load_config
from slipstream.files import read_run_jsonl, write_atomic
from slipstream.observe.rollouts import STEP_MARK
from slipstream.observe.runs import saved_changes
from slipstream.run.folder import write_config
from slipstream.run.setup import Run
from slipstream.run.summary import read_records
from slipstream.train.checkpoint import (
    checkpoint_step,
    list_checkpoints,
    load_trainer_state,
    load_weights,
    save_checkpoint,
)
from slipstream.train.precision import parse_dtype


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


# what a resume may change and still follow the run's trajectory: how far it goes (unless the
# learning rate decays over it: `_free`), what it shows, where its metrics go, and whether it
# is recorded (a resumed run never is)
RESUME_FREE = (
    "run.steps",
    "run.quiet",
    "run.sinks",
    "run.rollouts_per_step",
    "run.record_schedule",
    "wandb.",
)


def resume_changes(run_dir: Path, cfg: Config) -> list[str]:
    """The settings of `cfg` that differ from the run's own (`run_dir/config.toml`) other than
    `RESUME_FREE`; `ConfigError` if there is no checkpoint, `run.steps` is below its step, or
    `check_queue` refuses a change."""
    ckpt = latest_checkpoint(run_dir)
    step = checkpoint_step(ckpt)
    if cfg.run.steps < step:
        raise ConfigError(
            f"run.steps = {cfg.run.steps} is below the step of the newest checkpoint ({ckpt}); "
            f"give run.steps >= {step}"
        )
    check_queue(run_dir, cfg)
    changed = saved_changes(run_dir, cfg) or []  # (the CLI checked that config.toml is there)
    return [k for k in changed if not _free(k, cfg)]


class ResumeWarning(RuntimeWarning):
    """A run resumed with settings other than its own: it goes on with them."""


def changed_settings_notice(run_dir: Path, cfg: Config, changed: list[str]) -> str:
    """What a resume with the settings `changed` (`resume_changes`) says, in one line."""
    steps = ""
    if "run.steps" in changed:  # (only under a decaying learning-rate schedule)
        steps = (
            f"; with run.steps = {cfg.run.steps} the {cfg.trainer.lr_schedule} learning-rate "
            "schedule is recomputed over the new length, so from the resumed step on the "
            "learning rate follows the new schedule"
        )
    return (
        f"resuming {run_dir} with other settings than it ran with ({', '.join(changed)}); the "
        "resumed run is not bit-identical to an unbroken one, and its config.toml is rewritten "
        f"with them{steps}"
    )


def check_resume(cfg: Config) -> None:
    """The checks every resume of `cfg.run.dir` makes before any work, from the CLI (which
    says them first, in its own words) or the library (`train_sync` / `train_async` with
    `resume=True`): `ConfigError` without a checkpoint, with `run.steps` below its step, or
    with a change `check_queue` refuses; a `ResumeWarning` naming the settings that differ
    from the run's own."""
    run_dir = Path(cfg.run.dir or ".")
    changed = resume_changes(run_dir, cfg)
    if changed:
        warnings.warn(changed_settings_notice(run_dir, cfg, changed), ResumeWarning, stacklevel=3)


def resume_from(cfg: Config) -> Path:
    """The newest complete checkpoint of `cfg.run.dir`, the run folder `rewind`ed to it."""
    ckpt = latest_checkpoint(cfg.run.dir)
    rewind(ckpt)
    return ckpt


def _free(key: str, cfg: Config) -> bool:
    """`key` changes nothing the resumed run computes (`RESUME_FREE`). `run.steps` does under a
    decaying `trainer.lr_schedule`: the schedule spans `run.steps` (Trainer.lr_at), so the
    learning rate from the resumed step on follows the one over the new length."""
    if key == "run.steps" and cfg.trainer.lr_schedule != "constant":
        return False
    return any(_within(key, f) for f in RESUME_FREE)


def check_queue(run_dir: Path, cfg: Config) -> None:
    """ConfigError (one line, naming the setting and the run's value) if `cfg` changes what the
    checkpoint's queued work (`schedule.pipeline_state`) is built for: `schedule.name`, whose
    batching gives it its form (fixed batches, or one continuous window), or `runtime.kind`
    taking an orchestrated `sync` run into the in-process loop, which keeps no queue (the
    prompts it holds would be skipped). Nothing to compare without `run_dir/config.toml`."""
    path = run_dir / "config.toml"
    if not path.is_file():
        return
    ran = load_config(path)
    resume = "the resumed run cannot take its checkpoint's queued work; resume it with"
    if cfg.schedule.name != ran.schedule.name:
        name = ran.schedule.name
        raise ConfigError(
            f"schedule.name: the run ran with {name!r} and {resume} schedule.name = {name!r}"
        )
    kind = ran.runtime.kind
    if cfg.runtime_kind == "inprocess" != ran.runtime_kind:
        raise ConfigError(
            f"runtime.kind: the run ran on {kind!r} and {resume} runtime.kind = {kind!r}"
        )


def _within(key: str, entry: str) -> bool:
    """`key` is the setting `entry`, or in its table (`entry` ending in a dot)."""
    return key == entry or (entry.endswith(".") and key.startswith(entry))


def rewind(ckpt: Path) -> None:
    """Before resuming from `ckpt`: drop what the killed run wrote after it (metrics records,
    rollouts and timeline intervals of later steps, each file rewritten whole or not at all:
    `write_atomic`), so the resumed run does not repeat them;
    its `summary.json`, which only the end of a run writes (the resumed run's, if it gets
    there); and mark its schedule record incomplete, which the resumed run does not add to."""
    run_dir, step = ckpt.parent.parent, checkpoint_step(ckpt)
    (run_dir / "summary.json").unlink(missing_ok=True)
    void_record(run_dir, step)
    truncate_metrics(run_dir / "metrics.jsonl", step)
    rollouts = run_dir / "rollouts.txt"
    if rollouts.exists():
        text = rollouts.read_text(encoding="utf-8")
        cut = text.find(f"{STEP_MARK}{step + 1} ")
        if cut >= 0:
            write_atomic(rollouts, text[:cut])
    wall = json.loads((ckpt / "state.json").read_text()).get("wall_s")
    timeline = run_dir / "timeline.jsonl"
    if wall is not None and timeline.exists():
        keep = []
        for line in read_run_jsonl(timeline, OSError)[0]:
            try:
                if line.error is None and line.value["t0"] <= wall:
                    keep.append(line.text + "\n")
            except (KeyError, TypeError):
                continue  # not an interval: dropped, as a line that is not JSON is
        write_atomic(timeline, "".join(keep))


def void_record(run_dir: Path, step: int) -> None:
    """A schedule record (`run.record_schedule`) in `run_dir` stops covering the run once it is
    resumed (from step `step`): its meta.json says `complete: false` and `resumed_from`, so
    `slipstream replay` refuses it with the reason."""
    path = run_dir / "schedule" / "meta.json"
    if not path.exists():
        return
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return  # not a record replay would read either
    if isinstance(meta, dict):
        meta.update(complete=False, resumed_from=step)
        write_atomic(path, json.dumps(meta, indent=2))


def truncate_metrics(path: Path, step: int) -> None:
    """Drop records after `step` (and a torn last line, and any other line that is not JSON),
    written by a run killed after its checkpoint, so that the resumed run's records do not
    repeat them."""
    if not path.exists():
        return
    keep = []
    for line in read_run_jsonl(path, OSError)[0]:
        rec = line.value
        later = isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] > step
        if line.error is None and not later:
            keep.append(line.text + "\n")
    write_atomic(path, "".join(keep))


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
    if "rng_cuda" in trainer_state and torch.cuda.is_available():  # the GPUs there are now
        torch.cuda.set_rng_state_all(trainer_state["rng_cuda"][: torch.cuda.device_count()])
    write_config(run.dir, run.cfg)  # restored: the resumed run's settings are the run's now
    run.view.log(f"resumed from {ckpt} (step {run.trainer.version})")
    return state
