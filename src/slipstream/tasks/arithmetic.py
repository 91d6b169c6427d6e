"""The built-in task: running sums of a list of digits, with heavy-tailed lengths.

Prompt `3+5+4=`, completion `8,12`: the sum after each addition, comma-separated.

The number of terms k is drawn with P(k) ~ k^-3 on [3, 20], so most completions are a few
tokens and a few are fifty: the p99 completion length is about 6x the median, the straggler
shape of reasoning traces that makes synchronous RL wait. The verifier is exact: reward 1
only when the whole chain is right, so the model cannot shorten its traces to game the
reward and the length distribution stays heavy-tailed.
"""

from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass, field

from slipstream.types import Prompt

ALPHABET = "0123456789+=,"


def format_terms(terms: list[int]) -> str:
    return "+".join(map(str, terms)) + "="


def running_sums(terms: list[int]) -> str:
    """The exact expected completion for `terms`."""
    total, out = terms[0], []
    for x in terms[1:]:
        total += x
        out.append(str(total))
    return ",".join(out)


@functools.cache
def _length_cdf(k_min: int, k_max: int, alpha: float) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The term counts and their cumulative weights `k^-alpha`: what `random.choices` builds
    from `weights` on every call, built once (the same floats, so the same draws)."""
    ks = tuple(range(k_min, k_max + 1))
    return ks, tuple(itertools.accumulate(kk**-alpha for kk in ks))


def draw_terms(
    rng: random.Random, k_min: int, k_max: int, alpha: float, term_max: int = 9
) -> list[int]:
    ks, cum = _length_cdf(k_min, k_max, alpha)
    k = rng.choices(ks, cum_weights=cum)[0]
    return [rng.randint(0, term_max) for _ in range(k)]


def _make(
    rng: random.Random, pid: str, k_range: tuple[int, int], alpha: float, term_max: int
) -> Prompt:
    terms = draw_terms(rng, *k_range, alpha, term_max)
    return Prompt(
        id=pid, text=format_terms(terms), answer=running_sums(terms), meta={"k": len(terms)}
    )


@functools.lru_cache(maxsize=4)
def _draw_prompts(
    num_train: int, num_heldout: int, k_min: int, k_max: int, alpha: float, term_max: int, seed: int
) -> tuple[tuple[Prompt, ...], tuple[Prompt, ...]]:
    """The held-out and train prompts of one task's settings, drawn once per process (a run's
    setup, each sampler and each evaluation build the task; the draw is about 0.3 s)."""
    rng = random.Random(seed)
    held: dict[str, Prompt] = {}
    while len(held) < num_heldout:
        p = _make(rng, f"h{len(held)}", (k_min, k_max), alpha, term_max)
        held.setdefault(p.text, p)
    train: list[Prompt] = []
    while len(train) < num_train:
        p = _make(rng, f"t{len(train)}", (k_min, k_max), alpha, term_max)
        if p.text not in held:
            train.append(p)
    return tuple(held.values()), tuple(train)


@dataclass
class RunningSums:
    """Procedural built-in task; train and held-out prompts never overlap."""

    num_train: int = 20000
    num_heldout: int = 256
    k_min: int = 3
    k_max: int = 20
    alpha: float = 3.0
    term_max: int = 9
    seed: int = 1234
    name: str = "running_sums"
    _train: list[Prompt] = field(default_factory=list, repr=False)
    _heldout: list[Prompt] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not 2 <= self.k_min <= self.k_max:
            raise ValueError(f"need 2 <= k_min <= k_max, got {self.k_min}, {self.k_max}")
        held, train = _draw_prompts(
            self.num_train, self.num_heldout, self.k_min, self.k_max, self.alpha,
            self.term_max, self.seed,
        )  # fmt: skip
        self._heldout, self._train = list(held), list(train)

    def train_prompts(self) -> list[Prompt]:
        return self._train

    def heldout_prompts(self) -> list[Prompt]:
        return self._heldout

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 1.0 if completion.strip() == prompt.answer else 0.0

    def max_completion_tokens(self) -> int:
        """Longest correct completion in tokens, end-of-sequence included."""
        return (self.k_max - 1) * (len(str(self.term_max * self.k_max)) + 1)
