"""Writes tests/data/run_small: a tiny recorded `pipeline` run (2 samplers, 10 steps).

Values follow a real CPU run of the built-in task (sync loop, /tmp runs of the spine test),
with the keys the async runtime adds (staleness/*, runtime/*, queue/depth) and the files the
observe writers produce (timeline.jsonl, rollouts.txt). Deterministic: rerun to regenerate.

    python tests/data/make_run_small.py
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from slipstream.observe.rollouts import RolloutWriter
from slipstream.observe.sinks import JsonlSink
from slipstream.observe.timeline import TimelineWriter
from slipstream.types import FinishReason, Group, Prompt, Sample

OUT = Path(__file__).parent / "run_small"
STEPS, B, G, MAX_LAG = 10, 8, 8, 2

CONFIG = f"""[run]
dir = "tests/data/run_small"
seed = 0
steps = {STEPS}
quiet = true
threads = 0

[model]

[task]
kind = "builtin"
heldout_fraction = 0.1
reward = "math_verify"
prompt_template = "{{prompt}}"

[sampling]
group_size = {G}
temperature = 1.0
top_p = 1.0
top_k = 0
max_new_tokens = 64

[trainer]
batch_prompts = {B}
lr = 0.001
micro_batch_size = 64
advantage = "grpo"
loss = "ppo"

[schedule]
name = "pipeline"
max_lag = {MAX_LAG}

[eval]
every = 5
num_prompts = 256
"""


def groups_of(step: int, rng: random.Random) -> list[Group]:
    groups = []
    for b in range(B):
        a, c = rng.randint(1, 9), rng.randint(1, 9)
        prompt = Prompt(f"p{step * B + b}", f"running sum of {a} {c} {a + c}", str(a + c + a + c))
        samples = []
        for _ in range(G):
            n = rng.randint(4, 30)
            versions = [max(step - 2, 0)] * (n // 2) + [max(step - 1, 0)] * (n - n // 2)
            reward = float(rng.random() < 0.2 + 0.05 * step)
            text = str(a + c + a + c) if reward else str(rng.randint(10, 40))
            samples.append(
                Sample(
                    prompt.id,
                    list(range(8)),
                    list(range(n)),
                    [-0.5] * n,
                    versions,
                    FinishReason.STOP if n < 30 else FinishReason.LENGTH,
                    completion_text=text,
                    reward=reward,
                    sampler_id=b % 2,
                )
            )
        mean = sum(s.reward for s in samples) / G
        groups.append(Group(prompt, samples, [s.reward - mean for s in samples]))
    return groups


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    (OUT / "config.toml").write_text(CONFIG)
    (OUT / "model_info.json").write_text(
        json.dumps(
            {
                "params": 1_254_400,
                "layers": 4,
                "hidden": 128,
                "kv_heads": 2,
                "head_dim": 32,
                "vocab": 32,
            }
        )
    )
    rng = random.Random(0)
    metrics, timeline, rollouts = (
        JsonlSink(OUT / "metrics.jsonl"),
        TimelineWriter(OUT, origin=0.0),
        RolloutWriter(OUT, per_step=4),
    )
    t, generated, trained, filtered = 0.0, 0, 0, 0
    gen_end = [0.0, 0.0]
    timeline.interval("trainer", "wait", 0.0, 0.55)
    for step in range(1, STEPS + 1):
        # Samplers keep generating while the trainer trains: pipelined.
        for s in (0, 1):
            while gen_end[s] < t + 0.55:
                d = rng.uniform(0.12, 0.3)
                timeline.interval(f"sampler{s}", "generate", gen_end[s], gen_end[s] + d)
                gen_end[s] += d
            timeline.interval(f"sampler{s}", "weight_sync", gen_end[s], gen_end[s] + 0.01)
            gen_end[s] += 0.01
        t0 = max(t, 0.55)
        d_train = rng.uniform(0.18, 0.26)
        timeline.interval("trainer", "train", t0, t0 + d_train)
        t = t0 + d_train
        acc = None
        if step % 5 == 0:
            timeline.interval("trainer", "eval", t, t + 0.3)
            t += 0.3
            acc = round(0.05 + 0.03 * step + rng.uniform(-0.01, 0.01), 4)
        wait = rng.uniform(0.0, 0.08)
        timeline.interval("trainer", "wait", t, t + wait)
        t += wait
        groups = groups_of(step, rng)
        lens = [s.num_tokens for g in groups for s in g.samples]
        kept = [g for g in groups if len(set(g.rewards_G)) > 1]
        generated += B
        trained += len(kept)
        filtered += B - len(kept)
        n_trained = sum(g.num_tokens for g in kept)
        lag_counts = [0, 0, 0] if step > 1 else [sum(lens)]
        if step > 1:
            lag_counts[1], lag_counts[2] = sum(lens) // 2, sum(lens) - sum(lens) // 2
        rec = {
            "step": step,
            "version": step,
            "wall_s": round(t, 4),
            "step_time_s": round(d_train + wait, 4),
            "reward_mean": sum(s.reward for g in groups for s in g.samples) / (B * G),
            "train/loss": round(rng.uniform(-0.02, 0.03), 5),
            "train/clip_frac": round(rng.uniform(0, 0.05), 4),
            "train/ratio_max": round(1 + rng.uniform(0, 0.2), 4),
            "train/entropy": round(0.85 - 0.01 * step, 4),
            "train/grad_norm": round(rng.uniform(1.5, 3.5), 3),
            "train/lr": 0.001,
            "tokens/trained": n_trained,
            "tokens/generated": sum(lens),
            "tokens/wasted": sum(lens) - n_trained,
            "time/generate_s": round(0.55, 3),
            "time/train_s": round(d_train, 4),
            "engine/tokens_per_s": round(sum(lens) / 0.55, 1),
            "train/tokens_per_s": round(n_trained / d_train, 1),
            "runtime/sampler_busy": round(rng.uniform(0.93, 0.99), 3),
            "runtime/trainer_wait": round(wait / (d_train + wait), 3),
            "queue/depth": rng.randint(1, 4),
            "completion_len_mean": sum(lens) / len(lens),
            "completion_len_max": max(lens),
            "completion_lens": lens,
            "ledger/generated": generated,
            "ledger/trained": trained,
            "ledger/stale": 0,
            "ledger/aborted": 0,
            "ledger/lost": 0,
            "ledger/filtered": filtered,
        }
        if acc is not None:
            rec["heldout_acc"] = acc
        if step > 1:  # the first batch is on-policy: no staleness yet
            rec |= {
                "staleness/lag_mean": round(
                    sum(i * c for i, c in enumerate(lag_counts)) / sum(lag_counts), 3
                ),
                "staleness/lag_max": 2,
                "staleness/ess_token": round(rng.uniform(0.85, 0.97), 3),
                "staleness/ess_seq": round(rng.uniform(0.7, 0.9), 3),
                "staleness/lag_counts": lag_counts,
            }
        metrics.write(rec)
        rollouts.write(step, groups)
    metrics.close()
    timeline.close()
    ledger = {
        "generated": generated,
        "trained": trained,
        "filtered": {"zero_variance": filtered},
        "stale": 0,
        "aborted": 0,
        "lost": 0,
        "in_flight": 0,
        "balanced": True,
    }
    summary = {
        "heldout_acc_start": 0.0469,
        "heldout_acc_end": acc,
        "wall_s": round(t, 4),
        "steps": STEPS,
        "skipped_steps": 0,
        "ledger": ledger,
        "prompts_skipped": {},
    }
    (OUT / "ledger.json").write_text(json.dumps(ledger, indent=2))
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
