"""The built-in agentic task: running sums of numbers up to 99, with a slow calculator.

Prompt `48+93+28=`; answer `141,169` (the built-in task's running sums, on terms of 0..99
instead of digits: k terms with P(k) ~ k^-3 on [2, 6]; short, so that the built-in model
learns to copy calls and replies in a short warm start). The model is the built-in
character model, never taught to add such numbers; it has a calculator instead: one tool,
`calc`, that returns the running sums of a `+`-separated expression. A solved episode is two turns,
in the plain tool format (envs.parse)::

    48+93+28=                        the prompt (no tool list: the model knows its one tool)
    CALL calc 48+93+28<eos>          model turn 1 (trained)
    RESULT calc: 141,169             the tool's reply (environment tokens, never trained)
    141,169<eos>                     model turn 2, the answer (trained), rewarded exactly

The calculator takes its time: each call sleeps a lognormal latency with median
`env.tool_latency_median_s` and 99th percentile `env.tool_latency_p99_s` (by default the
slowest 1 % take 30x the median), the skew of real sandboxes and APIs that makes synchronous
RL wait. With p99 = median every call takes exactly the median.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

from slipstream.envs.render import Codec, PlainRenderer, encode_tail
from slipstream.envs.tools import ToolReply
from slipstream.tasks.arithmetic import ALPHABET, RunningSums, running_sums
from slipstream.types import FinishReason, Prompt, Sample

# the built-in alphabet, plus what tool calls, replies and errors are written with
TOOLS_ALPHABET = ALPHABET + " \n:ACELRSTU" + "abcdefghijklmnopqrstuvwxyz'()-."
Z99 = 2.3263478740408408  # the standard normal's 99th percentile


def tool_sums_task(seed: int = 1234, num_train: int = 20000) -> RunningSums:
    """The prompts and the exact verifier (running sums of 2-6 terms of 0..99)."""
    return RunningSums(num_train, k_min=2, k_max=6, term_max=99, seed=seed, name="tool_sums")


@dataclass(frozen=True)
class Latency:
    """Lognormal seconds with `median_s` and 99th percentile `p99_s` (>= median)."""

    median_s: float = 0.02
    p99_s: float = 0.6

    def __post_init__(self) -> None:
        if not 0 <= self.median_s <= self.p99_s:
            raise ValueError(f"need 0 <= median <= p99, got {self.median_s}, {self.p99_s}")

    @property
    def sigma(self) -> float:
        """ln X ~ N(ln median, sigma^2), so p99 = median * exp(Z99 * sigma)."""
        if self.median_s == 0:
            return 0.0
        return math.log(self.p99_s / self.median_s) / Z99

    def draw(self, rng: random.Random) -> float:
        if self.median_s == 0:
            return 0.0
        return self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))


class Calculator:
    """The tool class of the built-in agentic task (one instance per episode)."""

    def __init__(self, latency: Latency | None = None, seed: int = 0) -> None:
        self.latency = latency or Latency(0.0, 0.0)
        self.rng = random.Random(seed)
        self.answer = ""

    def reset(self, **row: object) -> str | None:
        self.answer = str(row["answer"])
        return None

    def calc(self, expr: str) -> ToolReply:
        """Running sums of a +-separated list of integers: 1+2+3 gives 3,6."""
        time.sleep(self.latency.draw(self.rng))
        parts = expr.strip().rstrip("=").split("+")
        if len(parts) < 2 or not all(p.isdigit() for p in parts):
            return ToolReply("calc", "error: expected integers joined by +", error=True)
        return ToolReply("calc", running_sums([int(p) for p in parts]))

    def reward(self, completion: str) -> float:
        return float(completion.strip() == self.answer)


RENDERER = PlainRenderer(describe_tools=False)


def scripted_trace(prompt: Prompt, tok: Codec, eos_id: int) -> Sample:
    """A solved episode of `prompt` as a supervised sample: the call, the tool's reply (masked
    out of the loss, as in RL), the answer. Log-probs and versions are unused (0)."""
    call = [*encode_tail(tok, f"CALL calc {prompt.text.rstrip('=')}"), eos_id]
    reply = encode_tail(tok, RENDERER.replies([ToolReply("calc", str(prompt.answer))]))
    answer = [*encode_tail(tok, str(prompt.answer)), eos_id]
    tokens = call + reply + answer
    mask = [True] * len(call) + [False] * len(reply) + [True] * len(answer)
    n = len(tokens)
    return Sample(
        prompt.id,
        tok.encode(prompt.text),
        tokens,
        [0.0] * n,
        [0] * n,
        FinishReason.STOP,
        model_mask_T=mask,
    )
