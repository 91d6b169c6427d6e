"""Held-out evaluation: the numbers a run is judged by, in the forms papers report them.

For n completions per prompt (`eval.samples_per_prompt`), of which c pass (reward at least
`eval.pass_threshold`):

- `mean@n`: the mean reward over all n x P completions (`heldout_acc`, greedy when n = 1);
- `pass@1`: the mean over prompts of c / n, the unbiased estimate of pass@1;
- `pass@k` (k = n > 1): the mean over prompts of 1 - C(n - c, k) / C(n, k), the unbiased
  estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", eq. 1),
  computed as the product 1 - prod_{i<k} (n - c - i) / (n - i) to stay finite for large n.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from slipstream.engine import Engine, Request, SamplingParams
from slipstream.model.tokenizer import Tokenizer
from slipstream.tasks.base import Task
from slipstream.tasks.guard import score_completions
from slipstream.types import CompletionText, Prompt, TrainerState


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that at least one of k of the n samples passes, given c of them did (unbiased)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a pass
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


class PromptIds:
    """The token ids of each held-out set, encoded at its first evaluation and kept: a run's
    sets do not change, and a run evaluates them often (thousands of prompts, each encoded
    twice an evaluation before: to skip those too long, and to generate). A set replaced by
    another list (or a tokenizer by another) is encoded anew."""

    def __init__(self) -> None:
        self._sets: dict[str, tuple[Sequence[Prompt], Tokenizer, list[list[int]]]] = {}

    def of(self, name: str, prompts: Sequence[Prompt], tokenizer: Tokenizer) -> list[list[int]]:
        """The ids of set `name`, whose prompts are `prompts`."""
        held = self._sets.get(name)
        if held is None or held[0] is not prompts or held[1] is not tokenizer:
            held = (prompts, tokenizer, [tokenizer.encode_prompt(p) for p in prompts])
            self._sets[name] = held
        return held[2]


def rewards_of(
    engine: Engine,
    tokenizer: Tokenizer,
    task: Task,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    n: int = 1,
    seed: int = 0,
    state: TrainerState | None = None,
    ids: Sequence[list[int]] | None = None,
) -> list[list[float]]:
    """Rewards `[P][n]` of n completions of each prompt (one reward round trip per prompt),
    scored at `state` (what a TRL-shaped reward gets as `trainer_state`).

    Seeds are `seed + i * n + j`: every evaluation samples with the same random numbers, so
    two evaluations of a run differ by the weights only. `ids`: the prompts' token ids where
    known (`PromptIds`), else encoded here.
    """
    if ids is None:
        ids = [tokenizer.encode_prompt(p) for p in prompts]
    reqs = [
        Request(ids[i], params, seed=seed + i * n + j, key=(i, j))
        for i in range(len(prompts))
        for j in range(n)
    ]
    texts: list[list[str]] = [[""] * n for _ in prompts]
    for k, c in enumerate(engine.generate(reqs)):  # in request order
        i, j = divmod(k, n)
        texts[i][j] = CompletionText(tokenizer.decode(c.tokens), c.tokens, state)
    return [[v.reward for v in score_completions(task, p, t)] for p, t in zip(prompts, texts)]


def summarize(rewards: list[list[float]], threshold: float = 1.0) -> dict[str, float]:
    """`mean@n`, `pass@1` and (n > 1) `pass@n` of rewards `[P][n]` (module docstring)."""
    if not rewards:
        return {}
    n = len(rewards[0])
    passes = [sum(r >= threshold for r in row) for row in rewards]
    out = {
        f"mean@{n}": sum(map(sum, rewards)) / (n * len(rewards)),
        "pass@1": sum(pass_at_k(n, c, 1) for c in passes) / len(rewards),
    }
    if n > 1:
        out[f"pass@{n}"] = sum(pass_at_k(n, c, n) for c in passes) / len(rewards)
    return out


def heldout_accuracy(
    engine: Engine, tokenizer: Tokenizer, task: Task, prompts: Sequence[Prompt], max_new_tokens: int
) -> float:
    """Mean reward of greedy completions of `prompts` (temperature 0)."""
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    rewards = rewards_of(engine, tokenizer, task, prompts, params)
    return sum(r[0] for r in rewards) / max(len(rewards), 1)
