"""What a task is: a prompt source, a held-out split and a verifier."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from slipstream.types import Prompt

RewardFn = Callable[[Prompt, str], float]


class Task(Protocol):
    """A verifiable task. `reward` must be a pure function of the prompt and completion."""

    name: str

    def train_prompts(self) -> list[Prompt]: ...

    def heldout_prompts(self) -> list[Prompt]: ...

    def reward(self, prompt: Prompt, completion: str) -> float: ...


@dataclass
class PromptSource:
    """Draws training prompts in shuffled epochs; its position is part of a checkpoint.

    Deterministic for a seed: epoch e is the prompts shuffled with `Random(seed + e)`.
    """

    prompts: list[Prompt]
    seed: int = 0
    epoch: int = 0
    index: int = 0

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("the task has no training prompts")
        self._order = self._shuffled(self.epoch)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def draw(self) -> Prompt:
        if self.index >= len(self._order):
            self.epoch += 1
            self.index = 0
            self._order = self._shuffled(self.epoch)
        prompt = self.prompts[self._order[self.index]]
        self.index += 1
        return prompt

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed, self.epoch, self.index = state["seed"], state["epoch"], state["index"]
        self._order = self._shuffled(self.epoch)
