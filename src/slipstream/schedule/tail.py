"""Tail batching: issue prompts in order of expected completion length.

A fixed batch waits for its longest sample. If the prompts of one batch have similar lengths,
the short ones finish together and the long ones share one batch, so fewer slots sit idle
behind a straggler. The orchestrator draws a pool of `tail_pool x B` prompts, sorts it by
expected length, and issues it as consecutive batches, shortest first.

Expected length is learned from what was generated so far, most specific estimate first:

1. the prompt itself: an exponential moving average of its groups' mean completion length;
2. prompts of the same prompt length (characters): most tasks' answers grow with the question,
   and a prompt seen once in a long run says little about the thousands never seen;
3. the mean of all groups so far; before any group, every prompt ties and the pool keeps its
   drawn order (a stable sort).

The cost is a bias: each batch holds prompts of one length class, so consecutive steps see
different slices of the task (a short batch, then a long one) instead of a random sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slipstream.types import Prompt


class LengthModel:
    """Expected completion length (tokens) of a prompt, learned online."""

    def __init__(self, decay: float = 0.5) -> None:
        if not 0 <= decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self._by_prompt: dict[str, float] = {}
        self._by_size: dict[int, tuple[float, int]] = {}  # prompt chars -> (sum, count)
        self._sum, self._count = 0.0, 0

    def update(self, prompt: Prompt, lengths: Sequence[int]) -> None:
        """Record one finished group of `prompt` (its completion lengths in tokens)."""
        if not lengths:
            return
        mean = sum(lengths) / len(lengths)
        old = self._by_prompt.get(prompt.id)
        self._by_prompt[prompt.id] = (
            mean if old is None else self.decay * old + (1 - self.decay) * mean
        )
        s, n = self._by_size.get(len(prompt.text), (0.0, 0))
        self._by_size[len(prompt.text)] = (s + mean, n + 1)
        self._sum += mean
        self._count += 1

    def expected(self, prompt: Prompt) -> float:
        if prompt.id in self._by_prompt:
            return self._by_prompt[prompt.id]
        s, n = self._by_size.get(len(prompt.text), (0.0, 0))
        if n:
            return s / n
        return self._sum / self._count if self._count else 0.0

    def state_dict(self) -> dict[str, Any]:
        """What it learned, as JSON (for checkpoints: a resumed run sorts as before)."""
        return {
            "by_prompt": dict(self._by_prompt),
            "by_size": [[n, s, c] for n, (s, c) in self._by_size.items()],
            "sum": self._sum,
            "count": self._count,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self._by_prompt = {k: float(v) for k, v in d["by_prompt"].items()}
        self._by_size = {int(n): (float(s), int(c)) for n, s, c in d["by_size"]}
        self._sum, self._count = float(d["sum"]), int(d["count"])

    def order(self, prompts: Sequence[Prompt]) -> list[Prompt]:
        """`prompts` sorted by expected length, shortest first; ties keep their order."""
        return sorted(prompts, key=self.expected)
