"""What the engine is asked and what it returns: a request, how to sample it, its completion."""

from __future__ import annotations

import random
import struct
from collections.abc import Hashable
from dataclasses import dataclass, field

from slipstream.types import FinishReason

MIN_TEMPERATURE = 1e-4
"""The smallest temperature above 0 (greedy) that a request may ask for: below it the
sampler's float32 scaling of the logits (x / T) loses the order of the top ones, and no token
is left to draw."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request. top_k 0 and top_p 1 keep all. temperature 0 is greedy: the
    argmax of the logits, which no filter changes, so a greedy request's top_k and top_p are
    set to 0 and 1 here (as vLLM's `SamplingParams` does): it does not count as filtering
    (`filters`), records no `kept_logmass`, and can take the CUDA sampling graph, whoever
    built it (evaluation, warm-start episodes, a user of `Engine`)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64

    def __post_init__(self) -> None:
        # checked here, not mid-step: a bad value raised inside `Engine.step` after the
        # forward pass, leaving every slot of the batch in a broken state; as the sampler
        # stores them (float32): a top_p of 1e-46 is 0 there, and keeps no token
        if not _f32(self.top_p) > 0.0 or self.top_p > 1.0:
            raise ValueError(f"top_p must be in (0, 1] (above 0 in float32), got {self.top_p}")
        if self.top_k < 0 or self.temperature < 0 or self.temperature != self.temperature:
            raise ValueError(
                f"need top_k >= 0 and temperature >= 0, got {self.top_k}, {self.temperature}"
            )
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, "
                f"got {self.temperature}"
            )
        if self.temperature == 0.0:  # checked above, then dropped: greedy ignores both
            object.__setattr__(self, "top_k", 0)
            object.__setattr__(self, "top_p", 1.0)

    @property
    def filters(self) -> bool:
        """Whether the sampler truncates this request's distribution: top-k, or a top-p below
        1 as the sampler stores it (float32: 0.99999999 is 1 there, and keeps all)."""
        return self.top_k > 0 or _f32(self.top_p) < 1.0


def _f32(x: float) -> float:
    """`x` as a float32 holds it."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def fresh_seed() -> int:
    """The seed of a request that names none: the next draw of Python's `random` (63 bits, as
    an episode's turn seeds), so a program that seeds `random` draws the same seeds again."""
    return random.getrandbits(63)


@dataclass
class Request:
    """One sequence to generate. `seed` fixes its sampling noise (see engine.sampling); a
    request without one gets a fresh seed (`fresh_seed`), as vLLM's `seed=None` draws fresh
    noise: n requests for one prompt are then n samples, not n copies of one."""

    prompt_tokens: list[int]
    params: SamplingParams
    seed: int = field(default_factory=fresh_seed)
    key: Hashable = None  # the caller's handle (a dict key), returned with the completion
    park: bool = False  # a turn of an episode: keep its KV when it stops (engine.parking)


@dataclass
class Completion:
    """What the engine returns for a request: tokens with per-token log-probs and versions.

    `logp[t]` is the behaviour log-prob of `tokens[t]` (temperature-scaled full softmax) under
    the weights of version `versions[t]`; `kept_logmass[t]` is log of the probability mass kept
    by top-k / top-p (None for a request without them; see engine.sampling for its use).
    """

    request: Request
    tokens: list[int]
    logp: list[float]
    versions: list[int]
    finish_reason: FinishReason
    t_start: float
    t_end: float
    kept_logmass: list[float] | None = None
