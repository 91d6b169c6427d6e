"""The synchronous loop: draw, generate, score, advantages, train, repeat. One screen.

Consumes prompts; produces one optimizer step per iteration; waits for the whole batch of
generations (the straggler wait that the other schedules remove). The engine shares the
trainer's model object, so a new version reaches it with no copy. What happens between
generation and the trainer (filters, overlong, replay, dynamic sampling, group sizes) is in
`Run.collect` and `Run.settle`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from slipstream.config import Config
from slipstream.schedule.setup import COUNTERS, Run, setup
from slipstream.train.checkpoint import save_checkpoint
from slipstream.types import Group


def train_sync(cfg: Config) -> dict[str, Any]:
    run = setup(cfg)
    t_start = time.perf_counter()
    run.timeline.origin = t_start  # timeline seconds match the metrics' wall_s
    acc_start = acc = run.evaluate()
    run.view.log(f"run folder {run.dir}; held-out accuracy at start {acc_start:.3f}")
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
            empty_draws += 1
            if empty_draws > 20:
                raise RuntimeError("20 batches in a row had no informative group: check the reward")
            continue
        empty_draws = 0
        # 2. one optimizer step; the engine samples from the new version from now on
        t1 = time.perf_counter()
        metrics = run.trainer.step(kept)
        run.engine.version = run.eval_engine.version = run.trainer.version
        run.ledger.trained += len(kept)
        t_train = time.perf_counter() - t1
        run.timeline.interval("trainer", "train", t1 - t_start, t1 - t_start + t_train)
        step = run.trainer.version
        t_step = time.perf_counter() - t0  # evaluation is not part of the step's time
        if step % cfg.eval.every == 0 or step == cfg.run.steps:
            with run.timeline.span("trainer", "eval"):
                acc = metrics["heldout_acc"] = run.evaluate()
        record = step_record(run, groups, metrics, mark, t_gen, t_train, t_step, t_start)
        run.sink.write(record)
        run.rollouts.write(step, groups)
        run.view.update(step, record)
        mark, groups = marks(run), []
        if step % cfg.checkpoint.every == 0 or step == cfg.run.steps:
            checkpoint(run)
    return finish(run, acc_start, acc, time.perf_counter() - t_start)


def marks(run: Run) -> dict[str, float]:
    """Engine and settling counters now; a step record reports the change since its mark, so
    generation of batches that trained nothing is counted in the next record."""
    return {**run.engine.stats.snapshot(), **{k: run.counters[k] for k in COUNTERS}}


def step_record(run: Run, groups: list[Group], metrics, mark, t_gen, t_train, t_step, t_start) -> dict[str, Any]:  # type: ignore[no-untyped-def]
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
        **metrics,
        "time/generate_s": t_gen,
        "time/train_s": t_train,
        "tokens/generated": gen_tokens,
        **{k: d[k] for k in COUNTERS},  # tokens/wasted, replay/samples, filters/...
        "engine/tokens_per_s": gen_tokens / max(t_gen, 1e-9),
        "train/tokens_per_s": metrics["tokens/trained"] / max(t_train, 1e-9),
        "engine/decode_steps": d["decode_steps"],
        "engine/prefill_tokens": d["prefill_tokens"],
        "sampler_busy": t_gen / max(t_step, 1e-9),
        "completion_len_mean": sum(lens) / len(lens),
        "completion_len_max": max(lens),
        "completion_lens": lens,
        **run.ledger.flat(),
    }


def checkpoint(run: Run) -> None:
    state = {
        "version": run.trainer.version,
        "source": run.source.state_dict(),
        "draws": run.draws,
        "ledger": run.ledger.as_dict(),
        "pass_rates": run.pass_rates.state_dict(),
        "replay": run.replay.state_dict() if run.replay is not None else None,
        "counters": dict(run.counters),
    }
    save_checkpoint(run.dir, run.trainer.version, run.model, run.tok, run.trainer.state_dict(), state, run.cfg.checkpoint.keep)


def finish(run: Run, acc_start: float, acc_end: float, wall: float) -> dict[str, Any]:
    run.view.close()
    run.sink.close()
    run.timeline.close()
    summary = {
        "heldout_acc_start": acc_start,
        "heldout_acc_end": acc_end,
        "wall_s": wall,
        "steps": run.trainer.version,
        "skipped_steps": run.trainer.skipped_steps,
        "ledger": run.ledger.as_dict(),
        "prompts_skipped": dict(run.prompts_skipped),
        **run.info,
    }
    (run.dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (run.dir / "ledger.json").write_text(json.dumps(run.ledger.as_dict(), indent=2))
    run.view.log(
        f"done: {summary['steps']} steps in {wall:.0f}s; held-out accuracy {acc_start:.3f} -> {acc_end:.3f}; "
        f"ledger {run.ledger.as_dict()}"
    )
    return summary
