"""Greedy held-out accuracy: the number a run is judged by."""

from __future__ import annotations

from collections.abc import Sequence

from slipstream.engine import Engine, Request, SamplingParams
from slipstream.model.tokenizer import Tokenizer
from slipstream.tasks.base import Task
from slipstream.types import Prompt


def heldout_accuracy(
    engine: Engine, tokenizer: Tokenizer, task: Task, prompts: Sequence[Prompt], max_new_tokens: int
) -> float:
    """Mean reward of greedy completions of `prompts` (temperature 0)."""
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    reqs = [Request(tokenizer.encode_prompt(p), params, key=p) for p in prompts]
    outs = engine.generate(reqs)
    return sum(task.reward(c.request.key, tokenizer.decode(c.tokens)) for c in outs) / max(
        len(outs), 1
    )
