"""A token-level environment for end-to-end tests (`env.factory=tests/scripted_env.py:three_turns`):
three model turns whatever the model writes, so runs exercise continuations and parked KV."""

from __future__ import annotations

from slipstream.envs import Observation, StepResult, encode_tail
from slipstream.model.tokenizer import Tokenizer
from slipstream.types import Prompt


class ThreeTurns:
    def __init__(self, row: Prompt, tok: Tokenizer) -> None:
        self.row, self.tok, self.turns = row, tok, 0

    def initial_observation(self) -> Observation:
        return Observation(self.tok.encode(self.row.text), self.row.text)

    def step(self, action_tokens: list[int]) -> StepResult:
        self.turns += 1
        if self.turns == 3:  # some variance within a group: the length of the last turn
            return StepResult(reward=float(len(action_tokens) % 2), done=True)
        return StepResult(0.0, False, Observation(encode_tail(self.tok, "1+2="), "1+2="))


def three_turns(row: Prompt, tok: Tokenizer) -> ThreeTurns:
    return ThreeTurns(row, tok)
