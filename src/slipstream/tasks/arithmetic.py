"""The built-in task: running sums of a list of digits, with heavy-tailed lengths.

Prompt `3+5+4=`, completion `8,12`: the sum after each addition, comma-separated.

The number of terms k is drawn with P(k) ~ k^-3 on [3, 20], so most completions are a few
tokens and a few are fifty: the p99 completion length is about 6x the median, the straggler
shape of reasoning traces that makes synchronous RL wait. The verifier is exact: reward 1
only when the whole chain is right, so the model cannot shorten its traces to game the
reward and the length distribution stays heavy-tailed.
"""

from __future__ import annotations

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


def draw_terms(
    rng: random.Random, k_min: int, k_max: int, alpha: float, term_max: int = 9
) -> list[int]:
    ks = list(range(k_min, k_max + 1))
    k = rng.choices(ks, weights=[kk**-alpha for kk in ks])[0]
    return [rng.randint(0, term_max) for _ in range(k)]


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
        rng = random.Random(self.seed)
        held: dict[str, Prompt] = {}
        while len(held) < self.num_heldout:
            p = self._make(rng, f"h{len(held)}")
            held.setdefault(p.text, p)
        self._heldout = list(held.values())
        train: list[Prompt] = []
        while len(train) < self.num_train:
            p = self._make(rng, f"t{len(train)}")
            if p.text not in held:
                train.append(p)
        self._train = train

    def _make(self, rng: random.Random, pid: str) -> Prompt:
        terms = draw_terms(rng, self.k_min, self.k_max, self.alpha, self.term_max)
        return Prompt(
            id=pid, text=format_terms(terms), answer=running_sums(terms), meta={"k": len(terms)}
        )

    def train_prompts(self) -> list[Prompt]:
        return self._train

    def heldout_prompts(self) -> list[Prompt]:
        return self._heldout

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 1.0 if completion.strip() == prompt.answer else 0.0

    def max_completion_tokens(self) -> int:
        """Longest correct completion in tokens, end-of-sequence included."""
        return (self.k_max - 1) * (len(str(self.term_max * self.k_max)) + 1)
