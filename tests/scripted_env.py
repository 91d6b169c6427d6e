"""A token-level environment for end-to-end tests (`env.factory=tests/scripted_env.py:three_turns`):
three model turns whatever the model writes, so runs exercise continuations and parked KV;
and `drive_episode`, which runs one episode of an `EpisodeRunner` on scripted model turns."""

from __future__ import annotations

from collections.abc import Callable

from slipstream.envs import Observation, StepResult, encode_tail
from slipstream.model.tokenizer import Tokenizer
from slipstream.schedule.episodes import Episode, EpisodeRunner
from slipstream.types import FinishReason, Prompt


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


class FlatOnEven(ThreeTurns):
    """Three turns; a row whose text has an even CRC-32 scores 1 whatever the model writes (a
    group of equal rewards: the zero-variance filter drops it), any other as `ThreeTurns`."""

    def step(self, action_tokens: list[int]) -> StepResult:
        import zlib

        out = super().step(action_tokens)
        if out.done and zlib.crc32(self.row.text.encode()) % 2 == 0:
            return StepResult(reward=1.0, done=True)
        return out


def flat_on_even(row: Prompt, tok: Tokenizer) -> FlatOnEven:
    return FlatOnEven(row, tok)


class EveryNth(ThreeTurns):
    """Three turns; `marked` is set on every `nth` environment of its class this process
    builds (each subclass counts its own)."""

    nth, built = 1, 0

    def __init__(self, row: Prompt, tok: Tokenizer) -> None:
        super().__init__(row, tok)
        cls = type(self)
        cls.built += 1
        self.marked = cls.built % cls.nth == 0


class Straggler(EveryNth):
    """Every twentieth environment built sleeps 0.7 s in each step: its group outlives the
    windows the other groups fill (a straggler, stale under a small K)."""

    nth = 20

    def step(self, action_tokens: list[int]) -> StepResult:
        if self.marked:
            import time

            time.sleep(0.7)
        return super().step(action_tokens)


def straggler(row: Prompt, tok: Tokenizer) -> Straggler:
    return Straggler(row, tok)


class Fragile(EveryNth):
    """The environment's worker process SIGKILLs itself at the second step of every fourth
    episode it builds (a crash the episode runner must count, `crash`)."""

    nth = 4

    def step(self, action_tokens: list[int]) -> StepResult:
        if self.marked and self.turns == 1:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action_tokens)


def fragile(row: Prompt, tok: Tokenizer) -> Fragile:
    return Fragile(row, tok)


class ByMode:
    """Token-level test environment driven by its row's `mode`: `ok` (two turns), `raise`
    (its step raises), `exit` (its step raises SystemExit), `hang` (its step sleeps 60 s),
    `slow` (each step sleeps `sleep_s`)."""

    def __init__(self, row: Prompt) -> None:
        self.mode, self.turns = row.meta.get("mode", "ok"), 0
        self.sleep_s = float(row.meta.get("sleep_s", 0.0))

    def initial_observation(self) -> Observation:
        return Observation([2, 3, 4])

    def step(self, action_tokens: list[int]) -> StepResult:
        import os
        import time

        self.turns += 1
        if self.mode == "raise":
            raise RuntimeError("tool crashed")
        if self.mode == "exit":
            raise SystemExit(3)
        if self.mode == "hang":
            time.sleep(60)
        if self.mode == "sandbox":  # a `python` tool call that sleeps 60 s
            from slipstream.envs import run_python

            run_python("import time\ntime.sleep(60)")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.turns >= 2:
            return StepResult(reward=1.0, done=True, metrics={"pid": float(os.getpid())})
        return StepResult(0.0, False, Observation([5, 6]))


def drive_episode(
    runner: EpisodeRunner,
    row: Prompt,
    turns: list[list[int]],
    finish: Callable[[list[int]], FinishReason] = lambda out: FinishReason.STOP,
) -> Episode:
    """One episode of `runner` on `row` with the model turns `turns`, no engine: each turn is
    cut at its request's `max_new_tokens` and ends as `finish` says; the runner is closed."""
    from slipstream.engine import Completion

    runner.start(row, "k", 0)
    ended: list[Episode] = []
    try:
        while not ended:
            runner.wait(0.05)
            requests, ended = runner.poll()
            for r in requests:
                out = turns.pop(0)[: r.params.max_new_tokens]
                n = len(out)
                runner.turn(Completion(r, out, [0.0] * n, [0] * n, finish(out), 0, 0))
    finally:
        runner.close()
    return ended[0]
