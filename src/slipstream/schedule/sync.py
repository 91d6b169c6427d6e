"""The synchronous loop: draw, generate, score, advantages, train, repeat. One screen.

Consumes prompts; produces one optimizer step per iteration; waits for the whole batch of
generations (the straggler wait that the other schedules remove). The engine shares the
trainer's model object, so a new version reaches it with no copy.
"""

from __future__ import annotations

import json
import time
from typing import Any

from slipstream.config import Config
from slipstream.schedule.setup import Run, setup
from slipstream.train.checkpoint import save_checkpoint


def train_sync(cfg: Config) -> dict[str, Any]:
    run = setup(cfg)
    t_start = time.perf_counter()
    run.timeline.origin = t_start  # timeline seconds match the metrics' wall_s
    acc_start = acc = run.evaluate()
    run.view.log(f"run folder {run.dir}; held-out accuracy at start {acc_start:.3f}")
    empty_draws = 0
    while run.trainer.version < cfg.run.steps:
        t0 = time.perf_counter()
        e0 = run.engine.stats.snapshot()
        # 1. draw B prompts and sample G completions of each (waits for the longest one)
        prompts = run.draw(cfg.trainer.batch_prompts)
        requests = [r for p in prompts for r in run.requests(p, cfg.sampling.group_size)]
        completions = run.engine.generate(requests)
        G = cfg.sampling.group_size
        groups = [run.score(p, completions[i * G : (i + 1) * G]) for i, p in enumerate(prompts)]
        t_gen = time.perf_counter() - t0
        run.timeline.interval("sampler0", "generate", t0 - t_start, t0 - t_start + t_gen)
        run.timeline.interval("trainer", "wait", t0 - t_start, t0 - t_start + t_gen)
        # 2. advantages and filters; groups with no signal go to the ledger, not the trainer
        kept = run.settle(groups)
        if not kept:
            empty_draws += 1
            if empty_draws > 20:
                raise RuntimeError("20 batches in a row had no informative group: check the reward")
            continue
        empty_draws = 0
        # 3. one optimizer step; the engine samples from the new version from now on
        t1 = time.perf_counter()
        metrics = run.trainer.step(kept)
        run.engine.version = run.eval_engine.version = run.trainer.version
        run.ledger.trained += len(kept)
        t_train = time.perf_counter() - t1
        run.timeline.interval("trainer", "train", t1 - t_start, t1 - t_start + t_train)
        step = run.trainer.version
        if step % cfg.eval.every == 0 or step == cfg.run.steps:
            with run.timeline.span("trainer", "eval"):
                acc = metrics["heldout_acc"] = run.evaluate()
        record = step_record(run, groups, metrics, e0, t_gen, t_train, time.perf_counter() - t0, t_start)
        run.sink.write(record)
        run.rollouts.write(step, groups)
        run.view.update(step, record)
        if step % cfg.checkpoint.every == 0 or step == cfg.run.steps:
            checkpoint(run)
    return finish(run, acc_start, acc, time.perf_counter() - t_start)


def step_record(run: Run, groups, metrics, e0, t_gen, t_train, t_step, t_start) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    e1 = run.engine.stats.snapshot()
    lens = [s.num_tokens for g in groups for s in g.samples]
    rewards = [s.reward for g in groups for s in g.samples]
    gen_tokens = e1["tokens_generated"] - e0["tokens_generated"]
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
        "tokens/wasted": gen_tokens - metrics["tokens/trained"],
        "engine/tokens_per_s": gen_tokens / max(t_gen, 1e-9),
        "train/tokens_per_s": metrics["tokens/trained"] / max(t_train, 1e-9),
        "engine/decode_steps": e1["decode_steps"] - e0["decode_steps"],
        "engine/prefill_tokens": e1["prefill_tokens"] - e0["prefill_tokens"],
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
