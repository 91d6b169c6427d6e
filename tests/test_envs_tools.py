"""The tool layer: parsing tool calls, tool specs from a class, replies (errors included)."""

from __future__ import annotations

import asyncio
import json
import string
from typing import Literal, Optional

import numpy as np
import pytest

from slipstream.envs import (
    HermesRenderer,
    Observation,
    PlainRenderer,
    StepResult,
    ToolCall,
    ToolEnv,
    call_tool,
    encode_tail,
    parse_tool_calls,
    resolve,
    tool_specs,
)
from slipstream.model.chat import ChatTemplate
from slipstream.model.tokenizer import Tokenizer, char_tokenizer
from slipstream.tasks.datasets import Row
from slipstream.tasks.rows import RowFormat
from slipstream.types import Prompt

TOK = char_tokenizer(string.printable)


class Calc:
    def reset(self, **row: object) -> str | None:
        self.answer = row["answer"]
        return None

    def add(self, a: float, b: float) -> float:
        """Add two numbers."""
        return a + b

    def shout(self, text: str, times: int = 1) -> str:
        """Repeat text in capitals."""
        return text.upper() * times

    def boom(self) -> str:
        """Always fails."""
        raise RuntimeError("kaput")

    def reward(self, completion: str) -> float:
        return float(completion.strip() == str(self.answer))

    def _private(self) -> None: ...


def test_parse_hermes_blocks_in_order_with_bad_json_reported() -> None:
    text = (
        'think <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
        '<tool_call>{"name": "shout", "arguments": "{\\"text\\": \\"hi\\"}"}</tool_call>'
        "<tool_call>{not json}</tool_call>"
    )
    calls = parse_tool_calls(text, "hermes")
    assert [c.name for c in calls] == ["add", "shout", ""]
    assert calls[0].arguments == {"a": 1, "b": 2} and not calls[0].error
    assert calls[1].arguments == {"text": "hi"}  # arguments given as a JSON string
    assert "not valid JSON" in calls[2].error
    assert parse_tool_calls("the answer is 3", "hermes") == []


def test_parse_plain_lines() -> None:
    text = 'x\nCALL add {"a": 1, "b": 2}\n  CALL shout hello world\nCALL boom\nno CALL here'
    calls = parse_tool_calls(text, "plain")
    assert calls == [
        ToolCall("add", {"a": 1, "b": 2}),
        ToolCall("shout", text="hello world"),
        ToolCall("boom"),
    ]
    assert "not valid JSON" in parse_tool_calls("CALL add {a: 1}", "plain")[0].error


def test_specs_from_public_methods_with_types_and_docstrings() -> None:
    specs = {s.name: s for s in tool_specs(Calc())}
    assert sorted(specs) == ["add", "boom", "shout"]  # not reset, reward, _private
    add = specs["add"].schema()["function"]
    assert add["description"] == "Add two numbers."
    assert add["parameters"] == {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    }
    assert specs["shout"].parameters["required"] == ["text"]


def test_call_tool_replies_and_errors() -> None:
    specs = tool_specs(Calc())
    assert call_tool(specs, ToolCall("add", {"a": 1, "b": 2.5})).text == "3.5"
    assert call_tool(specs, ToolCall("add", {"a": "2", "b": 3})).text == "5.0"  # text coerced
    assert call_tool(specs, ToolCall("shout", text="ab")).text == "AB"  # plain free text
    for call, expect in [
        (ToolCall("boom"), "error: RuntimeError: kaput"),
        (ToolCall("nope"), "error: unknown tool 'nope'"),
        (ToolCall("add", {"a": 1}), "error: add needs argument 'b'"),
        (ToolCall("add", {"a": 1, "b": 2, "c": 3}), "error: add has no argument 'c'"),
        (ToolCall("shout", {"text": "x", "times": "many"}), "error: argument 'times'"),
        (ToolCall("add", {"a": [1], "b": 2}), "error: argument 'a' of add should be float"),
        (ToolCall("", error="bad"), "error: bad"),
    ]:
        reply = call_tool(specs, call)
        assert reply.error and reply.text.startswith(expect), (call, reply)


def test_tool_env_episode_plain() -> None:
    row = Prompt("p0", "What is 1+2?", answer="3.0")
    env = ToolEnv(Calc(), row, TOK, fmt="plain", renderer=PlainRenderer())
    first = env.initial_observation()
    assert first.text.startswith("Tools:\n- add(a, b): Add two numbers.")
    assert first.text.endswith("What is 1+2?")
    assert TOK.decode(first.tokens) == first.text
    r = env.step(TOK.encode('CALL add {"a": 1, "b": 2}\nCALL boom'))
    assert not r.done and r.next_observation is not None
    assert r.next_observation.text == "\nRESULT add: 3.0\nRESULT boom: error: RuntimeError: kaput\n"
    assert r.metrics == {"tool_calls": 2.0, "tool_errors": 1.0}
    end = env.step(TOK.encode("3.0"))
    assert end.done and end.reward == 1.0


def test_tool_env_hermes_render_and_task_reward() -> None:
    class NoReward:
        def add(self, a: int, b: int) -> int:
            """Add."""
            return a + b

    row = Prompt("p1", "1+2?", answer="3")
    env = ToolEnv(
        NoReward(), row, TOK, "hermes", HermesRenderer(), reward=lambda p, c: float(p.answer in c)
    )
    text = env.initial_observation().text
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    tools_line = text.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(tools_line)["function"]["name"] == "add"
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    r = env.step(TOK.encode(call))
    assert r.next_observation is not None
    assert "<tool_response>\n3\n</tool_response>" in r.next_observation.text
    assert env.step(TOK.encode("it is 3")).reward == 1.0


def test_resolve_runs_async_envs() -> None:
    async def obs() -> Observation:
        await asyncio.sleep(0)
        return Observation([1, 2])

    assert resolve(obs()).tokens == [1, 2]
    assert resolve(StepResult(1.0)).reward == 1.0


def test_tool_replies_carry_no_special_tokens_of_a_tokenizer_that_adds_eos() -> None:
    """A tokenizer that appends EOS to what it encodes (tokenizer_config `add_eos_token`):
    the reply tokens appended mid-episode hold no EOS (the model would read a sequence end
    before its next turn; the scripted warm-start traces had a doubled EOS)."""
    tok = Tokenizer(TOK.inner, eos_id=TOK.eos_id, pad_id=TOK.pad_id, append_eos=True)
    row = Prompt("p0", "What is 1+2?", answer="3.0")
    env = ToolEnv(Calc(), row, tok, fmt="plain", renderer=PlainRenderer())
    env.initial_observation()
    r = env.step(tok.encode('CALL add {"a": 1, "b": 2}', add_special_tokens=False))
    assert r.next_observation is not None
    assert r.next_observation.tokens == TOK.encode("\nRESULT add: 3.0\n")
    assert tok.eos_id not in encode_tail(tok, "3.0")


def test_a_hermes_call_cut_before_its_closing_tag_is_a_bad_call_not_the_answer() -> None:
    """A turn cut by its token budget inside a call (or a model that forgets `</tool_call>`):
    the call is answered with a format error and the episode goes on; before, the turn was
    taken for the final answer and the episode ended scored on a half-written call."""
    cut = '<tool_call>\n{"name": "add", "arguments": {"a": 1'
    (call,) = parse_tool_calls(cut, "hermes")
    assert call.error.startswith("tool call not closed")
    both = parse_tool_calls('<tool_call>{"name": "add", "arguments": {}}</tool_call>' + cut)
    assert [bool(c.error) for c in both] == [False, True]
    row = Prompt("p", "1+2?", answer="3")
    env = ToolEnv(Calc(), row, TOK, "hermes", HermesRenderer())
    r = env.step(TOK.encode(cut))
    assert not r.done and r.metrics == {"tool_calls": 1.0, "tool_errors": 1.0}
    assert (
        r.next_observation is not None and "error: tool call not closed" in r.next_observation.text
    )


def test_a_long_tool_reply_keeps_its_head_and_tail() -> None:
    """A reply over `max_reply_chars` is cut in the middle, as the sandbox cuts its output
    (a traceback's end says what failed): before, only the head was kept, so with the default
    limits (sandbox 4000 chars, replies 2000) the end of a long output never reached the model."""

    class Long:
        def run(self) -> str:
            """Prints a lot, then fails."""
            return "x" * 5000 + "\nZeroDivisionError: division by zero"

    env = ToolEnv(Long(), Prompt("p", "go", None), TOK, "plain", max_reply_chars=100)
    r = env.step(TOK.encode("CALL run"))
    assert r.next_observation is not None
    text = r.next_observation.text
    assert text.startswith("\nRESULT run: xxx") and "chars cut" in text
    assert text.endswith("ZeroDivisionError: division by zero\n") and len(text) < 200


def test_an_async_environment_keeps_its_event_loop_across_steps() -> None:
    """What an async environment starts in one method (a task, a subprocess, a client) is
    there at its next: each call ran in a fresh `asyncio.run`, which cancelled the tasks left
    at its end and closed its loop, so a step awaiting one raised CancelledError."""

    class Ticking:
        async def initial_observation(self) -> Observation:
            self.loop = asyncio.get_running_loop()
            self.task = asyncio.create_task(asyncio.sleep(0.01, result=7.0))
            return Observation([1])

        async def step(self, action_tokens: list[int]) -> StepResult:
            assert asyncio.get_running_loop() is self.loop
            return StepResult(await self.task, True)

    env = Ticking()
    resolve(env.initial_observation())
    assert resolve(env.step([2])).reward == 7.0


def test_a_tool_that_exits_is_answered_with_its_error() -> None:
    """A tool raising `SystemExit` (argparse in a wrapped command line, a `sys.exit()`) is a
    tool that raises: its reply is the error. Before, it escaped `call_tool` and took the
    environment worker down, with every episode whose environment lived there (`crash`)."""

    class Cli:
        def run(self, args: str) -> str:
            """Runs a command line."""
            raise SystemExit(2)

    reply = call_tool(tool_specs(Cli()), ToolCall("run", {"args": "--bad"}))
    assert reply.error and reply.text == "error: SystemExit: 2"


def test_a_closing_tag_inside_a_json_string_does_not_end_the_hermes_call() -> None:
    """Code that prints `</tool_call>` (a string of the call's JSON): the block ends at the tag
    after the JSON object. Before, the first tag closed it: the call was bad JSON and the rest
    of the code stray text."""
    code = "print('<tool_call>x</tool_call>')"
    call = json.dumps({"name": "run", "arguments": {"code": code}})
    text = f"<tool_call>\n{call}\n</tool_call> then <tool_call>{{bad</tool_call>"
    good, bad = parse_tool_calls(text, "hermes")
    assert (good.name, good.arguments, good.error) == ("run", {"code": code}, "")
    assert "not valid JSON" in bad.error
    extra = parse_tool_calls('<tool_call>{"name": "a"} junk</tool_call>', "hermes")
    assert len(extra) == 1 and "not valid JSON" in extra[0].error  # trailing text is reported
    (cut,) = parse_tool_calls(f"<tool_call>{call[:-2]}", "hermes")  # in the string, unclosed
    assert cut.error


class AsyncCalc:
    """A tool class whose methods are coroutines (TRL environments may have async tools)."""

    async def reset(self, **row: object) -> str | None:
        self.loop, self.answer = asyncio.get_running_loop(), row["answer"]
        return "Use add."

    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        await asyncio.sleep(0)
        assert asyncio.get_running_loop() is self.loop  # the same loop at every call
        return a + b

    async def boom(self) -> str:
        """Always fails."""
        raise RuntimeError("async kaput")

    async def reward(self, completion: str) -> float:
        return float(completion.strip() == str(self.answer))


def test_async_tools_reset_and_reward_are_awaited() -> None:
    """Before, an `async def` tool was called and never awaited: its reply was
    `<coroutine object ...>` (and `reset`'s extra text, `reward`'s float, failed alike)."""
    env = ToolEnv(AsyncCalc(), Prompt("p", "1+2?", answer="3"), TOK, "plain")
    assert env.initial_observation().text.endswith("1+2?\nUse add.")
    r = env.step(TOK.encode('CALL add {"a": 1, "b": 2}\nCALL boom'))
    assert r.next_observation is not None
    assert (
        r.next_observation.text
        == "\nRESULT add: 3\nRESULT boom: error: RuntimeError: async kaput\n"
    )
    assert env.step(TOK.encode("3")).reward == 1.0


def test_resolve_on_the_environments_loop_is_an_error_not_a_hang() -> None:
    """An async environment that calls a sync helper which resolves a coroutine (`call_tool`
    of an async tool, from inside its `step`) would wait for its own loop for ever."""

    replies = []

    class Nested:
        async def step(self, action_tokens: list[int]) -> StepResult:
            call = ToolCall("add", {"a": 1, "b": 2})
            replies.append(call_tool(tool_specs(AsyncCalc()), call))
            return StepResult(1.0, True)

    assert resolve(Nested().step([1])).reward == 1.0  # it returned (unguarded: it would hang)
    assert replies[0].error and "await it instead" in replies[0].text


def test_calls_past_the_cap_count_as_calls_made_and_each_as_an_error() -> None:
    """Three calls with `max_calls_per_turn=1`: one runs, two are refused with one error
    reply. `tool_calls` counts the three the model made; `tool_errors` the two refused
    (before: 1, so the error rate understated the refused calls)."""
    env = ToolEnv(Calc(), Prompt("p", "go", None), TOK, "plain", max_calls_per_turn=1)
    r = env.step(TOK.encode('CALL add {"a": 1, "b": 2}\nCALL boom\nCALL boom'))
    assert r.next_observation is not None
    assert r.next_observation.text == (
        "\nRESULT add: 3.0\nRESULT boom: error: at most 1 tool calls a turn\n"
    )
    assert r.metrics == {"tool_calls": 3.0, "tool_errors": 2.0}
    bad = env.step(TOK.encode("CALL boom\nCALL nope"))  # under the cap: each reply counts
    assert bad.metrics == {"tool_calls": 2.0, "tool_errors": 2.0}


def test_an_integer_past_floats_range_is_a_bad_argument_and_replies_keep_unicode() -> None:
    """Before, a 400-digit integer for a float argument raised OverflowError out of
    `call_tool` (the episode ended `error`), and a non-string result was sent as `\\u00fc`
    escapes (more tokens, and not the text)."""

    class Places:
        def city(self) -> dict[str, str]:
            """A city."""
            return {"name": "Zürich", "zh": "北京"}

    reply = call_tool(tool_specs(Calc()), ToolCall("add", {"a": 10**400, "b": 1}))
    assert reply.error and reply.text.startswith("error: argument 'a' of add should be float")
    assert len(reply.text) < 150
    assert call_tool(tool_specs(Places()), ToolCall("city")).text == (
        '{"name": "Zürich", "zh": "北京"}'
    )


def test_a_reward_that_is_not_a_number_names_what_returned_it() -> None:
    """Before, `float(None)` raised "float() argument must be a string or a real number, not
    'NoneType'", which named neither the method nor the value; a NaN reached the episode
    runner, whose message blamed the environment's step."""

    class Forgot(Calc):
        def reward(self, completion: str) -> float:
            return None  # type: ignore[return-value]  # a forgotten return

    env = ToolEnv(Forgot(), Prompt("p", "go", None), TOK, "plain")
    env.initial_observation()
    with pytest.raises(ValueError, match=r"^Forgot\.reward returned None, not a finite number"):
        env.step(TOK.encode("3"))

    class NoReward:
        def add(self, a: float, b: float) -> float:
            """Add."""
            return a + b

    for value, ok in [(float("nan"), False), ("1", False), (np.float32(0.5), True)]:
        env = ToolEnv(
            NoReward(), Prompt("p", "go", None), TOK, "plain", reward=lambda p, c, v=value: v
        )
        env.initial_observation()
        if ok:
            assert env.step(TOK.encode("3")).reward == 0.5
            continue
        with pytest.raises(
            ValueError, match=r"^the task's reward function returned .*not a finite"
        ):
            env.step(TOK.encode("3"))


class Typed:
    def pick(
        self,
        xs: list[int],
        mode: Literal["a", "b"],
        k: Optional[int] = None,  # noqa: UP045 - the typing spelling, as TRL users write it
        scale: float | None = None,
        tags: dict[str, bool] | None = None,
        either: int | list[int] = 0,
    ) -> str:
        """Pick.

        Args:
            xs: numbers
            mode: which
            k: how many
            scale: factor
            tags: flags
            either: one or several
        """
        return json.dumps([xs, mode, k, scale, tags, either])


def test_optional_list_and_literal_arguments_are_in_the_schema_and_checked() -> None:
    """`Optional[int]`, `int | None`, `list[int]`, `Literal[...]`, `dict[str, bool]` and a union
    have the schema transformers' `get_json_schema` gives them, and a value that does not fit
    is the tool's error reply (before: `{}` in the schema, and `"1,2"` reached the tool)."""
    (spec,) = tool_specs(Typed())
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "xs": {"type": "array", "items": {"type": "integer"}},
            "mode": {"type": "string", "enum": ["a", "b"]},
            "k": {"type": "integer", "nullable": True},
            "scale": {"type": "number", "nullable": True},
            "tags": {
                "type": "object",
                "additionalProperties": {"type": "boolean"},
                "nullable": True,
            },
            "either": {
                "anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}}]
            },
        },
        "required": ["xs", "mode"],
    }
    ok = call_tool([spec], ToolCall("pick", {"xs": [1, "2"], "mode": "b", "k": "5", "scale": 2}))
    assert not ok.error and json.loads(ok.text) == [[1, 2], "b", 5, 2.0, None, 0]
    assert (
        json.loads(call_tool([spec], ToolCall("pick", {"xs": [], "mode": "a", "k": None})).text)[2]
        is None
    )
    for args, expect in [
        ({"xs": "1,2", "mode": "a"}, "argument 'xs' of pick should be list[int], got '1,2'"),
        ({"xs": [1.5], "mode": "a"}, "argument 'xs' of pick should be list[int], got [1.5]"),
        (
            {"xs": [], "mode": "zzz"},
            "argument 'mode' of pick should be Literal['a', 'b'], got 'zzz'",
        ),
        (
            {"xs": [], "mode": "a", "k": "x"},
            "argument 'k' of pick should be Optional[int], got 'x'",
        ),
        (
            {"xs": [], "mode": "a", "scale": "big"},
            "argument 'scale' of pick should be float | None",
        ),
        (
            {"xs": [], "mode": "a", "tags": {"x": 1}},
            "argument 'tags' of pick should be dict[str, bool]",
        ),
        (
            {"xs": [], "mode": "a", "either": "x"},
            "argument 'either' of pick should be int | list[int]",
        ),
    ]:
        reply = call_tool([spec], ToolCall("pick", args))
        assert reply.error and reply.text.startswith(f"error: {expect}"), (args, reply)


def test_argument_schemas_are_the_ones_transformers_gives() -> None:
    transformers_utils = pytest.importorskip("transformers.utils")
    (spec,) = tool_specs(Typed())
    theirs = transformers_utils.get_json_schema(Typed().pick)["function"]["parameters"]
    for name, prop in theirs["properties"].items():
        prop.pop("description")
        assert spec.parameters["properties"][name] == prop, name
    assert spec.parameters["required"] == theirs["required"]


CHATML = (
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_reset_gets_the_rows_own_prompt_not_the_chat_rendering() -> None:
    """Rows read through a chat template: a string row's `prompt` is its text (after
    `task.prompt_template`), a conversation row's `prompt` and `messages` its messages
    (before: `prompt` was the rendered `<|im_start|>user ...` text, and no `messages`)."""
    seen: list[dict[str, object]] = []

    class Seen(Calc):
        def reset(self, **row: object) -> str | None:
            seen.append(row)
            return None

    fmt = RowFormat(template="Q: {prompt}", chat=ChatTemplate(CHATML))
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    rows = [
        fmt.prompt(Row("f:1", {"prompt": "2+3?", "answer": "5", "level": 1}), "r1"),
        fmt.prompt(Row("f:2", {"messages": convo, "answer": "5", "level": 2}), "r2"),
    ]
    assert rows[0].text.startswith("<|im_start|>user\nQ: 2+3?")  # what the model reads
    for row in rows:
        ToolEnv(Seen(), row, TOK, "hermes", HermesRenderer()).initial_observation()
    assert seen[0] == {"prompt": "Q: 2+3?", "answer": "5", "id": "r1", "level": 1}
    assert seen[1] == {"prompt": convo, "messages": convo, "answer": "5", "id": "r2", "level": 2}
    assert seen[1]["messages"] is not rows[1].messages  # a copy: reset may change it
    plain = Prompt("r3", "Q: 2+3?", "5")  # no chat template: the text is the prompt
    ToolEnv(Seen(), plain, TOK, "plain").initial_observation()
    assert seen[2] == {"prompt": "Q: 2+3?", "answer": "5", "id": "r3"}


def test_parse_bare_json_calls_and_parameters_for_arguments() -> None:
    """The `json` format (Llama 3.1's tools templates): a turn that is one JSON object with a
    name and `parameters` (or `arguments`) is a call; `parameters` is taken for `arguments` in
    a `<tool_call>` block too (before: ignored, the call had no arguments)."""
    call = '{"name": "add", "parameters": {"a": 1, "b": 2}}'
    assert parse_tool_calls(f"\n {call}\n", "json") == [ToolCall("add", {"a": 1, "b": 2})]
    assert parse_tool_calls('{"name": "add", "arguments": "{\\"a\\": 1}"}', "json") == [
        ToolCall("add", {"a": 1})
    ]
    for answer in ["3", "it is 3", f"I call {call}", '{"name": "Paris"}', '{"a": 1}', "[1]"]:
        assert parse_tool_calls(answer, "json") == [], answer
    (cut,) = parse_tool_calls('{"name": "add", "parameters": {"a": 1', "json")  # budget hit
    assert cut.name == "" and "not valid JSON" in cut.error
    (bad,) = parse_tool_calls('{"name": 3, "parameters": {}}', "json")
    assert "needs" in bad.error
    hermes = parse_tool_calls(f"<tool_call>{call}</tool_call>", "hermes")
    assert hermes == [ToolCall("add", {"a": 1, "b": 2})]


def test_an_integer_past_ints_digit_limit_is_a_bad_call_or_an_answer_never_an_exception() -> None:
    """Before, json.loads' ValueError for an integer of over 4300 digits (a model repeating a
    digit for a whole turn) was not a JSONDecodeError: it escaped `parse_tool_calls`, and the
    step raised (the episode ended `error`) instead of answering with a format error."""
    big = "9" * 5000
    calls = {
        "hermes": f'<tool_call>{{"name": "add", "arguments": {{"a": {big}}}}}</tool_call>',
        "json": f'{{"name": "add", "parameters": {{"a": {big}}}}}',
        "plain": f'CALL add {{"a": {big}}}',
    }
    for fmt, text in calls.items():
        (call,) = parse_tool_calls(text, fmt)  # type: ignore[arg-type]
        assert "4300 digits" in call.error and len(call.error) < 120, (fmt, call)
    as_string = f'<tool_call>{{"name": "add", "arguments": "{{\\"a\\": {big}}}"}}</tool_call>'
    assert parse_tool_calls(as_string, "hermes")[0].error
    assert parse_tool_calls(big, "json") == []  # a long number as the answer: no call
    env = ToolEnv(Calc(), Prompt("p0", "q", answer="3"), TOK, fmt="plain")
    r = env.step(TOK.encode(calls["plain"]))
    assert not r.done and r.next_observation is not None
    assert "RESULT add: error: arguments are not valid JSON" in r.next_observation.text


def test_a_plain_argument_that_starts_with_a_brace_is_json_and_the_error_says_how_to_send_text() -> (
    None
):
    """The docs said any plain argument that is not a JSON object is the tool's text; the
    parser reads every argument starting with `{` as JSON (a bad call if it is not), so code
    such as `{1: 2}` was a format error whose reply did not say how to send it. Now the docs
    say what the parser does, and the error reply says it."""
    [bad] = parse_tool_calls("CALL python {1: 2}", "plain")
    assert bad.name == "python" and bad.text is None
    assert bad.error.startswith("arguments are not valid JSON")
    assert 'goes as a JSON object: {"<argument>": "<text>"}' in bad.error
    [ok] = parse_tool_calls('CALL python {"code": "{1: 2}"}', "plain")
    assert ok == ToolCall("python", {"code": "{1: 2}"})
