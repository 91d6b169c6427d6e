"""An episode's reward gets `completion_ids` and `trainer_state`, as a single-turn reward does."""

from __future__ import annotations

import pickle
import string
from typing import Any

from scripted_env import drive_episode
from slipstream.config.env import EnvConfig
from slipstream.engine import SamplingParams
from slipstream.envs import PlainRenderer, ToolEnv
from slipstream.model.tokenizer import char_tokenizer
from slipstream.schedule.episodes import Episode, EpisodeRunner
from slipstream.tasks.rewards import adapt
from slipstream.types import CompletionText, Prompt, TrainerState, TurnTokens

TOK = char_tokenizer(string.printable)
ROW = Prompt("p0", "What is 1+2?", answer="3.0")


class Adder:
    seen: list[dict[str, Any]]

    def add(self, a: float, b: float) -> float:
        """Add two numbers."""
        return a + b

    def reward(self, completion: str, **kwargs: Any) -> float:
        self.seen.append({"completion": completion, **kwargs})
        return float(completion.strip() == "3.0")


class Named(Adder):
    def reward(self, completion: str, completion_ids: list[int]) -> float:  # type: ignore[override]
        self.seen.append({"completion": completion, "completion_ids": completion_ids})
        return 1.0


def _episode(
    env: ToolEnv, state: TrainerState, said: tuple[str, ...] = ('CALL add {"a": 1, "b": 2}', "3.0")
) -> Episode:
    """The episode of `env` for the model turns `said` (a call, then the answer), ended at
    `state`."""
    runner = EpisodeRunner(
        lambda p: env, SamplingParams(1.0, max_new_tokens=64),
        EnvConfig(isolation="thread"), 512, state=lambda: state,
    )  # fmt: skip
    turns = [TOK.encode(t, add_special_tokens=False) for t in said]
    return drive_episode(runner, env.row, turns)


def test_an_episode_reward_gets_the_episode_ids_and_the_trainer_state() -> None:
    """Before, a tool class's `reward` got only `completion=` and the task's reward function a
    plain str: a TRL-shaped reward reading `completion_ids` or `trainer_state` (TRL passes both,
    in its tool-calling loop too) got neither. Now both get the episode's tokens after its
    prompt (model turns and tool replies, TRL's multi-turn `completion_ids`) and the state the
    last turn ended at; a `reward` taking only some of them by name gets those."""
    state = TrainerState(5, 20)
    tools = Adder()
    tools.seen = []
    ep = _episode(ToolEnv(tools, ROW, TOK, "plain", PlainRenderer()), state)
    assert ep.stats.end == "done" and ep.reward == 1.0
    [got] = tools.seen
    assert got == {"completion": "3.0", "completion_ids": ep.tokens, "trainer_state": state}
    assert type(got["completion"]) is str  # the text, as before
    assert TOK.decode(ep.tokens).endswith("RESULT add: 3.0\n3.0")

    named = Named()
    named.seen = []
    ep = _episode(ToolEnv(named, ROW, TOK, "plain", PlainRenderer()), state)
    assert named.seen == [{"completion": "3.0", "completion_ids": ep.tokens}]

    class NoReward:  # the task's reward function: TRL-shaped, on the completion
        def add(self, a: float, b: float) -> float:
            """Add two numbers."""
            return a + b

    seen: list[dict[str, Any]] = []

    def trl(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
        seen.append({"completions": completions, **kw})
        return [1.0]

    env = ToolEnv(NoReward(), ROW, TOK, "plain", PlainRenderer(), reward=adapt(trl, "trl"))
    ep = _episode(env, state)
    assert ep.reward == 1.0
    assert seen[0]["completions"] == ["3.0"]
    assert seen[0]["completion_ids"] == [ep.tokens] and seen[0]["trainer_state"] == state


def test_turn_tokens_are_a_list_that_keeps_its_state_through_pickling() -> None:
    t = TurnTokens([1, 2], TrainerState(3, 4))
    back = pickle.loads(pickle.dumps(t))
    assert back == [1, 2] and back.trainer_state == TrainerState(3, 4)
    assert isinstance(back, list) and TurnTokens([7]).trainer_state is None


def test_a_run_s_episode_turns_end_at_the_engine_s_version() -> None:
    from types import SimpleNamespace

    from slipstream.config import Config
    from slipstream.envs.workers import ThreadWorkers
    from slipstream.schedule.agentic import make_runner

    cfg = Config()
    engine = SimpleNamespace(version=3, max_len=64, park=None)
    workers = ThreadWorkers(lambda p: ToolEnv(Adder(), p, TOK), 1)
    runner = make_runner(cfg, workers.factory, engine, SamplingParams(1.0), workers)  # type: ignore[arg-type]
    assert runner.state is not None and runner.state() == TrainerState(3, cfg.run.steps)
    engine.version = 4
    assert runner.state() == TrainerState(4, cfg.run.steps)
    workers.close()


def test_a_conversational_episode_s_trl_reward_gets_its_messages() -> None:
    """Before, a TRL-shaped reward got a conversational episode's completion as one assistant
    message holding the last turn's text, where TRL's tool loop passes every message after
    the prompt: a reward reading the tool replies (or `completions[i][-1]`, which TRL's
    appended turns put last) saw something else. Now it gets them as TRL builds them: each
    turn with its parsed `tool_calls`, each reply a `tool` message; the verl- and
    slipstream-shaped rewards still get the answer's text."""
    row = Prompt(
        "p1", "What is 1+2?", "3.0", messages=[{"role": "user", "content": "What is 1+2?"}]
    )

    class Tools:
        def add(self, a: float, b: float) -> float:
            """Add two numbers."""
            return a + b

        def echo(self, text: str) -> str:
            """Say `text` back."""
            return text

    seen: list[Any] = []

    def trl(prompts: list[Any], completions: list[Any], **kw: Any) -> list[float]:
        seen.append((prompts, completions))
        return [float(completions[0][-1]["content"] == "3.0")]

    def verl(data_source: str, solution_str: str, ground_truth: str, extra_info: Any) -> float:
        seen.append(solution_str)
        return 1.0

    first = 'Adding.\nCALL add {"a": 1, "b": 2}\nCALL echo hi there'
    for fn, shape in ((trl, "trl"), (verl, "verl")):
        env = ToolEnv(Tools(), row, TOK, "plain", PlainRenderer(), reward=adapt(fn, shape))
        ep = _episode(env, TrainerState(1, 2), (first, "3.0"))
        assert ep.stats.end == "done" and ep.reward == 1.0
    assert seen[0] == (
        [[{"role": "user", "content": "What is 1+2?"}]],
        [[
            {"role": "assistant", "content": first, "tool_calls": [
                {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}},
                {"type": "function", "function": {"name": "echo", "arguments": {"text": "hi there"}}},
            ]},
            {"role": "tool", "name": "add", "content": "3.0"},
            {"role": "tool", "name": "echo", "content": "hi there"},
            {"role": "assistant", "content": "3.0"},
        ]],
    )  # fmt: skip
    assert seen[1] == "3.0" and type(seen[1]) is not list  # verl: the answer's text
    text = CompletionText("3.0", [1], None, seen[0][1][0])  # to a reward worker process too
    assert pickle.loads(pickle.dumps(text)).messages == tuple(seen[0][1][0])
