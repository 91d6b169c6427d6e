"""`ToolEnv`: a tool class (envs.tools) as a token-level `Env`, one instance per sample.

The first observation is the row's prompt rendered with the tools (its conversation, with a
chat template). Each model turn is decoded and searched for tool calls (envs.parse). A turn
without any is the answer: the episode ends, rewarded by the class's `reward(completion=...)` if it has one
(`reset`, `reward` and the tools may be `async def`: each is awaited, envs.tools),
else by the `reward` function given (the task's verifier), else 0. The completion is the
answer's text; the reward also gets, as TRL's tool-calling GRPO passes them, `completion_ids`
(the episode's tokens after its prompt: every model turn and every tool reply between them, as
TRL's tool loop builds its `completion_ids`, tool tokens included) and `trainer_state` (the
`TrainerState` the last turn ended at, carried on its `TurnTokens`): the class's `reward`
where it takes them (by name, or `**kwargs`), a TRL-shaped reward function of the task on the
completion (a `CompletionText`, tasks.rewards), which also carries the episode's messages
after its prompt, as TRL's tool loop builds a conversational completion: each model turn as
`{"role": "assistant", "content": text}` (its decoded text, calls included), with
`"tool_calls"` (TRL/OpenAI-style `{"type": "function", "function": {"name", "arguments"}}`,
as parsed) where it called tools, each followed by its replies as
`{"role": "tool", "name": ..., "content": ...}` (the reply's text before rendering, cut as
the model read it). A turn with calls gets
every call's reply (errors included) rendered by the `Renderer` and appended as tokens; after
a turn that does not end with a chat renderer's `end_of_turn` token (cut by its token budget,
or stopped by another stop), that token closes the turn first.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from slipstream.envs.base import Observation, StepResult, resolve
from slipstream.envs.parse import ToolCall, ToolFormat, parse_tool_calls
from slipstream.envs.render import Codec, PlainRenderer, Renderer, encode_tail
from slipstream.envs.tools import ToolReply, ToolSpec, call_tool, tool_specs
from slipstream.tasks.guard import as_reward
from slipstream.text import short_repr
from slipstream.types import CompletionText, Prompt, TrainerState

RewardFn = Callable[[Prompt, str], float]


def row_kwargs(row: Prompt) -> dict[str, Any]:
    """What `reset(**row)` receives: the row's other fields, `answer`, `id`, and its prompt as
    the row has it, not as a chat template rendered it: a string row's text as `prompt` (after
    `task.prompt_template`); a conversation row's messages as `prompt` (as TRL passes a
    conversational dataset's prompt) and as `messages`, each a copy."""
    out = {**row.meta, "answer": row.answer, "id": row.id}
    if row.messages is not None and row.plain_prompt is None:  # a conversation
        return {**out, "prompt": _copy(row.messages), "messages": _copy(row.messages)}
    return {**out, "prompt": row.plain_prompt if row.plain_prompt is not None else row.text}


def _copy(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(m) for m in messages]


class ToolEnv:
    """Runs the tools of `tools` (an instance of a tool class) for the episode of `row`."""

    def __init__(
        self,
        tools: object,
        row: Prompt,
        tok: Codec,
        fmt: ToolFormat = "plain",
        renderer: Renderer | None = None,
        reward: RewardFn | None = None,
        max_calls_per_turn: int = 8,
        max_reply_chars: int = 2000,
    ) -> None:
        self.tools, self.row, self.tok, self.fmt = tools, row, tok, fmt
        self.renderer = renderer or PlainRenderer()
        self.reward_fn = reward
        self.max_calls, self.max_reply_chars = max_calls_per_turn, max_reply_chars
        self.specs = tool_specs(tools)
        self.history: list[int] = []  # the episode's tokens after the prompt, so far
        self.messages: list[dict[str, Any]] = []  # and its messages (module docstring)

    def initial_observation(self) -> Observation:
        reset = getattr(self.tools, "reset", None)
        extra = resolve(reset(**row_kwargs(self.row))) if callable(reset) else None
        return self.first_observation(self.row, extra)

    def first_observation(self, row: Prompt, extra: str | None = None) -> Observation:
        """The first observation of `row` with these tools, `extra` (what `reset` returned)
        appended: rendering only, no `reset` (run.agentic.env_max_len measures every row)."""
        text = row.text
        messages = [dict(m) for m in row.messages] if row.messages else None
        if extra:
            text = f"{text}\n{extra}"
            if messages:  # the row's conversation: the text joins its last turn
                messages[-1]["content"] = f"{messages[-1]['content']}\n{extra}"
        text = self.renderer.prompt(text, self.specs, messages)
        # a chat-rendered row holds its own special tokens (as `Tokenizer.encode_prompt`)
        chat = self.renderer.templated or messages is not None
        ids = self.tok.encode(text, add_special_tokens=not chat)
        return Observation(ids, text)

    def step(self, action_tokens: list[int]) -> StepResult:
        text = self.tok.decode(action_tokens)
        calls = parse_tool_calls(self._call_text(action_tokens), self.fmt)
        if not calls:
            ids = [*self.history, *action_tokens]
            state = getattr(action_tokens, "trainer_state", None)  # (TurnTokens)
            messages = [*self.messages, {"role": "assistant", "content": text}]
            completion = CompletionText(text, ids, state, messages)
            return StepResult(reward=self._reward(completion), done=True)
        replies = [self._truncate(call_tool(self.specs, c)) for c in calls[: self.max_calls]]
        refused = max(len(calls) - self.max_calls, 0)  # never run: one error reply for them
        if refused:
            msg = f"error: at most {self.max_calls} tool calls a turn"
            replies.append(ToolReply(calls[self.max_calls].name, msg, error=True))
        obs = self.renderer.replies(replies)
        end = getattr(self.renderer, "end_of_turn", None)
        if end and self._open(action_tokens, end):  # closed first, as the template closes it
            obs = end + obs
        metrics = {  # calls the model made; those not answered by their tool's result
            "tool_calls": float(len(calls)),
            "tool_errors": float(sum(r.error for r in replies[: self.max_calls]) + refused),
        }
        obs = _unicode(obs)
        ids = encode_tail(self.tok, obs, self.renderer.templated)
        self.history += [*action_tokens, *ids]
        self.messages += turn_messages(text, [tool_call(self.specs, c) for c in calls], replies)
        return StepResult(0.0, False, Observation(ids, obs), metrics)

    def _call_text(self, action_tokens: list[int]) -> str:
        """The turn's text searched for calls: with the stop string that ended it kept
        (`sampling.stop=["</tool_call>"]` ends a hermes call at its closing tag)."""
        keep = getattr(self.tok, "decode_with_stop", None)  # (model.Tokenizer's)
        return keep(action_tokens) if callable(keep) else self.tok.decode(action_tokens)

    def _open(self, action_tokens: list[int], end_of_turn: str) -> bool:
        """Whether the turn did not end with the template's end-of-turn token: cut by its
        token budget, or stopped by another stop (a stop string, Qwen's `<|endoftext|>`)."""
        end = encode_tail(self.tok, end_of_turn, templated=True)
        return bool(end) and action_tokens[-len(end) :] != end

    def _reward(self, completion: CompletionText) -> float:
        """The episode's reward; one that is not a finite number (None, NaN, text) raises
        a ValueError naming what returned it, which ends the episode `error`."""
        own = getattr(self.tools, "reward", None)
        if callable(own):
            extra = _accepted(own, _episode_kwargs(completion))
            value = resolve(own(completion=str(completion), **extra))
            source = f"{type(self.tools).__name__}.reward"
        elif self.reward_fn is not None:
            value = self.reward_fn(self.row, completion)
            source = "the task's reward function"
        else:
            return 0.0
        reward = as_reward(value)
        if reward is None:
            raise ValueError(f"{source} returned {short_repr(value)}, not a finite number")
        return reward

    def _truncate(self, r: ToolReply) -> ToolReply:
        """`r` cut to `max_reply_chars`, head and tail (as the sandbox cuts its output: the end
        of a traceback says what failed)."""
        n, text = self.max_reply_chars, r.text
        if len(text) <= n:
            return r
        head, tail = text[: n // 2], text[len(text) - (n - n // 2) :]
        return ToolReply(r.name, f"{head}\n... [{len(text) - n} chars cut] ...\n{tail}", r.error)


def tool_call(specs: list[ToolSpec], call: ToolCall) -> dict[str, Any]:
    """`call` as TRL's parsed tool calls are: `{"type": "function", "function": {"name": ...,
    "arguments": {...}}}`; a plain call's free text under its tool's first argument, as
    `call_tool` passes it (where the tool has one)."""
    args = dict(call.arguments)
    spec = next((s for s in specs if s.name == call.name), None)
    if call.text is not None and spec is not None:
        first = next(iter(spec.parameters["properties"]), None)
        args = {first: call.text} if first is not None else args
    return {"type": "function", "function": {"name": call.name, "arguments": args}}


def turn_messages(
    text: str, calls: list[dict[str, Any]], replies: list[ToolReply]
) -> list[dict[str, Any]]:
    """A turn with tool calls and its replies as TRL's tool loop appends them to a
    conversational completion: the assistant message, then one tool message a reply."""
    turn = {"role": "assistant", "content": text, "tool_calls": calls}
    return [turn, *({"role": "tool", "name": r.name, "content": r.text} for r in replies)]


def _episode_kwargs(completion: CompletionText) -> dict[str, list[int] | TrainerState | None]:
    """What a tool class's `reward` may take besides `completion` (module docstring)."""
    return {"completion_ids": list(completion.token_ids), "trainer_state": completion.trainer_state}


def _accepted(fn: Callable[..., object], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The items of `kwargs` that `fn` takes: by their name, or all with a `**kwargs`."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read: none of them
        return {}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return dict(kwargs)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in kwargs.items() if k in names}


def _unicode(text: str) -> str:
    """`text` with each lone surrogate as U+FFFD, which a tokenizer can encode (it refuses a
    str that is not valid Unicode): the model's JSON may write one (`"\\ud83d"`), and a tool
    that echoes its argument, or names it in its error, returns it."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
