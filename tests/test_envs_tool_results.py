"""Tool results and environment results that cannot be used as they are: each ends as an
error the model reads (a tool's) or as the episode's `error` (an environment's), never as an
exception out of the tool layer or the episode runner."""

from __future__ import annotations

import math
import string

import pytest

from slipstream.envs import Observation, StepResult, ToolCall, call_tool, tool_specs
from slipstream.types import FinishReason


class Results:
    def power(self, a: int, b: int) -> int:
        """a to the power b."""
        return a**b

    def odd(self) -> object:
        """An object whose text cannot be written."""

        class Odd:
            def __str__(self) -> str:
                raise RuntimeError("no text")

        return Odd()


def test_a_result_that_cannot_be_written_as_text_is_the_tools_error() -> None:
    """Before, an int of over 4300 digits (`str` and `json.dumps` refuse it) or an object whose
    `__str__` raises escaped `call_tool` after the tool had run: the step raised and the
    episode ended `error` instead of the model reading an error reply."""
    specs = tool_specs(Results())
    assert call_tool(specs, ToolCall("power", {"a": 2, "b": 10})).text == "1024"
    big = call_tool(specs, ToolCall("power", {"a": 2, "b": 20_000}))
    assert big.error and big.text.startswith("error: the int power returned cannot be shown")
    assert "4300 digits" in big.text and len(big.text) < 200
    odd = call_tool(specs, ToolCall("odd"))
    assert odd.error and "RuntimeError: no text" in odd.text


def test_a_lone_surrogate_the_model_wrote_and_a_tool_echoed_is_replaced_not_a_crash() -> None:
    """Before, a `\\ud83d` escape in the model's JSON arguments became a lone surrogate that a
    tool echoing its argument returned; the tokenizer refused the reply (TypeError) and the
    step raised, so the episode ended `error` instead of the model reading the reply."""
    from slipstream.envs import HermesRenderer, ToolEnv
    from slipstream.model.tokenizer import char_tokenizer
    from slipstream.types import Prompt

    class Echo:
        def echo(self, s: str) -> str:
            """Echo s."""
            return f"you said {s}"

    tok = char_tokenizer(string.printable + "\ufffd\U0001f600")
    env = ToolEnv(Echo(), Prompt("p", "q", "a"), tok, fmt="hermes", renderer=HermesRenderer())
    env.initial_observation()
    turn = '<tool_call>{"name": "echo", "arguments": {"s": "\\ud83d|\\ud83d\\ude00"}}</tool_call>'
    r = env.step(tok.encode(turn, add_special_tokens=False))
    assert r.next_observation is not None
    assert "you said \ufffd|\U0001f600\n" in r.next_observation.text  # (a valid pair is kept)
    assert tok.decode(r.next_observation.tokens) == r.next_observation.text


@pytest.mark.parametrize(
    ("method", "value", "expect"),
    [
        ("step", None, "step() returned None, not a StepResult"),
        ("step", StepResult(0.0, False, ([5, 6], "x")), "not an Observation"),  # type: ignore[arg-type]
        ("step", StepResult(0.0, False, Observation(None)), "not a list of token ids"),  # type: ignore[arg-type]
        ("step", StepResult(0.0, False, Observation([5]), {"tool_calls": "x"}), "tool_calls='x'"),
        ("step", StepResult(0.0, False, Observation([5]), {"tool_errors": math.nan}), "finite"),
        ("initial_observation", [2, 3], "initial_observation() returned [2, 3], not an Obs"),
    ],
)
def test_an_environment_result_of_the_wrong_shape_ends_its_episode_as_an_error(
    method: str, value: object, expect: str
) -> None:
    """Before, a step returning None (a forgotten `return`), a tuple for its observation, or a
    metric that is not a number raised out of `EpisodeRunner.poll` (an AssertionError,
    AttributeError or ValueError), taking the sampler's loop down with every episode in it;
    now the episode ends `error`, scored 0, with what was wrong in its message."""
    from test_envs_episodes import EOS, Scripted, _scripted

    env = Scripted(0, turns=3)
    setattr(env, method, lambda *a: value)
    ep = _scripted(env, [[3, EOS], [4, EOS], [4, EOS]])
    assert (ep.stats.end, ep.reward, ep.finish) == ("error", 0.0, FinishReason.ABORTED)
    assert expect in ep.error, ep.error
    good = _scripted(Scripted(0, turns=2), [[3, EOS], [4, EOS]])
    assert (good.stats.end, good.reward, good.stats.tool_calls) == ("done", 1.0, 1)


def test_a_property_that_needs_reset_is_not_read_to_list_the_tools() -> None:
    """Before, listing the tools (`inspect.getmembers`, when the `ToolEnv` is built, before
    `reset`) read every property: one reading state that `reset` sets up raised (a KeyError
    here), so building every environment of the class failed and each episode ended `error`."""
    from functools import cached_property

    from slipstream.envs import ToolEnv
    from slipstream.model.tokenizer import char_tokenizer
    from slipstream.types import Prompt

    class Game:
        def __init__(self) -> None:
            self.state: dict[str, int] = {}

        def reset(self, **row: object) -> None:
            self.state["score"] = 7

        @property
        def score(self) -> int:
            return self.state["score"]

        @cached_property
        def best(self) -> int:
            return self.state["score"] + 1

        def move(self, x: int) -> str:
            """Move."""
            return f"moved {x}, score {self.score}"

    game = Game()
    assert [s.name for s in tool_specs(game)] == ["move"]
    tok = char_tokenizer(string.printable)
    env = ToolEnv(game, Prompt("p", "q", "a"), tok, fmt="plain")
    env.initial_observation()
    r = env.step(tok.encode("CALL move 3", add_special_tokens=False))
    assert r.next_observation is not None and "moved 3, score 7" in r.next_observation.text


def test_static_and_class_methods_are_tools_too() -> None:
    """A tool class's public methods are its tools; a `@staticmethod` (a plain function when
    read from the instance) was left out, so the model was never told of it and its calls
    were answered "unknown tool"."""

    class Calc:
        def reset(self, **row: object) -> None:
            pass

        @staticmethod
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @classmethod
        def name(cls) -> str:
            """The calculator's name."""
            return cls.__name__

    specs = tool_specs(Calc())
    assert [(s.name, s.description) for s in specs] == [
        ("add", "Add two integers."),
        ("name", "The calculator's name."),
    ]
    assert specs[0].parameters["required"] == ["a", "b"]
    assert call_tool(specs, ToolCall("add", {"a": 2, "b": 3})).text == "5"
