"""Held-out accuracy of two models of the built-in agentic task, compared prompt by prompt.

Both models run greedy episodes (no tool latency; or SAMPLES sampled episodes a prompt at
TEMPERATURE, each prompt's reward their mean) on the same held-out prompts; the
difference of their accuracies has a paired standard error (the prompts are shared, so most
of the per-prompt noise cancels), which is what an RL-improved-it claim needs.

(Two runs' checkpoints in their own configs, tool latency and evaluation settings included:
`slipstream eval RUN_DIR` and bench/agentic_final.py.)

Run: python bench/agentic_paired.py MODEL_A MODEL_B [HELDOUT] [TEMPERATURE SAMPLES]
     (model folders: a warm start in ~/.cache/slipstream/builtin-tools2-..., or a run's
     RUN_DIR/checkpoints/step_N/model)

Ends with one JSON line: `n`, `acc_a`, `acc_b`, `diff` (b - a), `paired_se`, `b_only`
(prompts b solves and a does not), `a_only`.
"""

from __future__ import annotations

import json
import math
import sys

from slipstream.config.load import load_config
from slipstream.engine import Engine, SamplingParams
from slipstream.envs.builtin import Latency, tool_sums_task
from slipstream.envs.workers import ThreadWorkers
from slipstream.model import load_pretrained, load_tokenizer
from slipstream.run.agentic import calculator_factory, env_max_len, episode_rewards


def per_prompt(folder: str, n: int, temperature: float = 0.0, samples: int = 1) -> list[float]:
    """The episode reward of each of the first `n` held-out prompts, in order: greedy, or the
    mean of `samples` episodes at `temperature` (seeds i samples + j, as a run's evaluations)."""
    cfg = load_config(None, ["task.kind=builtin_tools"])
    model, tok = load_pretrained(folder), load_tokenizer(folder)
    held = tool_sums_task().heldout_prompts()[:n]
    factory = calculator_factory(cfg, tok, Latency(0.0, 0.0))
    max_len = min(env_max_len(cfg, factory, held, tok), model.config.max_position_embeddings)
    engine = Engine(model.eval(), tok.eos_id, num_slots=len(held) * samples, max_len=max_len)
    workers = ThreadWorkers(factory, cfg.env.workers)
    params = SamplingParams(temperature=temperature, max_new_tokens=cfg.sampling.max_new_tokens)
    try:
        rewards = episode_rewards(cfg, factory, engine, held, workers, params, samples)
    finally:
        workers.close()
    return [sum(r) / samples for r in rewards]


def paired(a: list[float], b: list[float]) -> dict[str, float]:
    """Accuracies of `a` and `b` (rewards of the same prompts, in order), their difference
    b - a and its standard error: the standard deviation of the per-prompt differences over
    sqrt(n)."""
    n = len(a)
    if n != len(b) or n < 2:
        raise ValueError(
            f"paired: need two equal lists of at least 2 rewards, got {n} and {len(b)}"
        )
    d = [y - x for x, y in zip(a, b, strict=True)]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    return {
        "n": n,
        "acc_a": sum(a) / n,
        "acc_b": sum(b) / n,
        "diff": mean,
        "paired_se": math.sqrt(var / n),
        "b_only": sum(1 for x, y in zip(a, b, strict=True) if y > x),
        "a_only": sum(1 for x, y in zip(a, b, strict=True) if y < x),
    }


def main(argv: list[str]) -> int:
    n = int(argv[2]) if len(argv) > 2 else 256
    temp, samples = (float(argv[3]), int(argv[4])) if len(argv) > 4 else (0.0, 1)
    out = paired(*(per_prompt(m, n, temp, samples) for m in argv[:2]))
    print("| model | held-out acc |\n| --- | ---: |")
    print(f"| a | {out['acc_a']:.3f} |\n| b | {out['acc_b']:.3f} |")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    asked = {"-h", "--help"} & set(sys.argv[1:])
    if asked or len(sys.argv) < 3:  # the usage above; exit 2 when arguments are missing
        sys.exit(print(__doc__) or (0 if asked else 2))
    sys.exit(main(sys.argv[1:]))
