"""How tool turns become text: the first prompt (with the tools) and the tool replies.

A `Renderer` is the hook where a model's chat template plugs in. Three are built in:

- `TemplateRenderer`: the model's own chat template (model.chat.ChatTemplate), for a template
  that renders tools (`supports_tools`: Qwen2.5/Qwen3/Hermes-style templates, which show the
  tools in the system turn and `<tool_response>` blocks for `tool` messages; Llama 3.1-style
  ones, which show them in the first user turn and `ipython` turns for `tool` messages, and
  ask for bare JSON calls: `template_tool_format`). The first prompt
  is `apply_chat_template(messages, tools=schemas, add_generation_prompt=True)`; the replies
  are the text the template puts after the model's turn for the `tool` messages, up to the
  next assistant turn opened: the template is rendered for a short stand-in conversation
  with the tool messages, and what follows the stand-in model turn's end-of-turn token is
  the suffix;
- `HermesRenderer`: the same ChatML strings written out (Qwen2.5's tools template), for a
  model trained on that format whose folder has no template;
- `PlainRenderer`: the `plain` call format, for models without a chat template (the built-in
  model): `RESULT <tool>: <reply>` lines after the model's turn; with a chat template that
  renders no tools, the lines are a user turn rendered by it (as `TemplateRenderer`'s replies).

Replies are rendered as text and tokenized alone, then appended after the model's tokens: the
history is never re-tokenized (token in, token out).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from slipstream.envs.parse import ToolFormat
from slipstream.envs.tools import ToolReply, ToolSpec


class Codec(Protocol):
    """What the tool layer needs of a tokenizer (model.Tokenizer is one)."""

    bos_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class Renderer(Protocol):
    templated: bool  # the text holds its own special tokens: encode it with none added

    def prompt(
        self, text: str, tools: Sequence[ToolSpec], messages: list[dict[str, Any]] | None = None
    ) -> str:
        """The text of the episode's first observation: the task prompt (`text`, or the row's
        conversation `messages` where the renderer uses them), with the tools."""
        ...

    def replies(self, replies: Sequence[ToolReply]) -> str:
        """The text appended after a model turn that called tools."""
        ...


class PlainRenderer:
    """The plain format. `describe_tools=False` shows no tool list (a model trained on one
    task's tools, as the built-in task's, does not need it). With the model's chat `template`
    (one that renders no tools), a row's conversation is rendered by it, the tool list opening
    its first user turn."""

    templated = False

    def __init__(
        self, describe_tools: bool = True, template: ChatTemplateLike | None = None
    ) -> None:
        self.describe_tools, self.template = describe_tools, template
        self.chat = TemplateRenderer(template) if template is not None else None
        self.end_of_turn = self.chat.end_of_turn if self.chat is not None else None

    def prompt(
        self, text: str, tools: Sequence[ToolSpec], messages: list[dict[str, Any]] | None = None
    ) -> str:
        listed = self.describe_tools and bool(tools)
        if messages and self.template is not None:
            msgs = [dict(m) for m in messages]
            user = next((m for m in msgs if m.get("role") == "user"), msgs[-1])
            if listed:
                user["content"] = f"{_tool_list(tools)}\n{user['content']}"
            return self.template.render(msgs)
        return f"{_tool_list(tools)}\n{text}" if listed else text

    def replies(self, replies: Sequence[ToolReply]) -> str:
        """`RESULT` lines; with a chat template, as a user turn after the model's, then the
        next assistant turn opened (what the template renders for that conversation)."""
        if self.chat is not None:
            body = "\n".join(f"RESULT {r.name}: {r.text}" for r in replies)
            return self.chat.after_turn([{"role": "user", "content": body}])
        return "".join(f"\nRESULT {r.name}: {r.text}" for r in replies) + "\n"


def _tool_list(tools: Sequence[ToolSpec]) -> str:
    lines = ["Tools:"]
    for t in tools:
        args = ", ".join(t.parameters["properties"])
        lines.append(f"- {t.name}({args}): {t.description}")
    lines.append('Call a tool on its own line: CALL <tool> {"<argument>": <value>, ...}')
    return "\n".join(lines)


class HermesRenderer:
    """Qwen2.5 / Hermes ChatML with tools (the model's turn ends with `<|im_end|>`, its EOS)."""

    templated = True
    end_of_turn = "<|im_end|>"  # what closes a model turn cut by its budget (envs.tool_env)

    def __init__(self, system: str = "You are a helpful assistant.") -> None:
        self.system = system

    def prompt(
        self, text: str, tools: Sequence[ToolSpec], messages: list[dict[str, Any]] | None = None
    ) -> str:
        turns = messages or [{"role": "user", "content": text}]  # the row's conversation
        sys = self.system
        if turns[0].get("role") == "system":
            sys, turns = str(turns[0]["content"]), turns[1:]
        if tools:
            sigs = "\n".join(json.dumps(t.schema()) for t in tools)
            sys += (
                "\n\n# Tools\n\nYou may call one or more functions to assist with the user query."
                "\n\nYou are provided with function signatures within <tools></tools> XML tags:"
                f"\n<tools>\n{sigs}\n</tools>\n\nFor each function call, return a json object "
                "with function name and arguments within <tool_call></tool_call> XML tags:\n"
                '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
                "</tool_call>"
            )
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in turns)
        return f"<|im_start|>system\n{sys}<|im_end|>\n{body}<|im_start|>assistant\n"

    def replies(self, replies: Sequence[ToolReply]) -> str:
        body = "\n".join(f"<tool_response>\n{r.text}\n</tool_response>" for r in replies)
        return f"\n<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n"


class ChatTemplateLike(Protocol):
    """What `TemplateRenderer` needs of a chat template (model.chat.ChatTemplate is one)."""

    special_tokens: dict[str, Any]

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str: ...


_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe_tool_x", "description": "d", "parameters": {"type": "object"}},
}
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "</s>")


def template_tool_format(template: ChatTemplateLike) -> ToolFormat | None:
    """The call format `template`'s tool prompt asks for: `hermes` where it shows `<tool_call>`
    tags, else `json` (a bare JSON object, as Llama 3.1's asks); None: it renders no tools."""
    if not supports_tools(template):
        return None
    shown = template.render([{"role": "user", "content": "hi"}], tools=[_PROBE_TOOL])
    return "hermes" if "<tool_call>" in shown else "json"


def supports_tools(template: ChatTemplateLike) -> bool:
    """Whether `template` shows tools given to it (a tools template) and renders `tool` turns."""
    user = [{"role": "user", "content": "hi"}]
    try:
        with_tools = template.render(user, tools=[_PROBE_TOOL])
        turn = [*user, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "R9"}]
        replied = template.render(turn)
    except ValueError:
        return False
    return "probe_tool_x" in with_tools and "R9" in replied


class TemplateRenderer:
    """A model's own chat template with tools (module docstring). `end_of_turn` is the text of
    the token that ends the model's turn (default: of the template's `eos_token` and the usual
    end-of-turn tokens, the first the template writes after a stand-in assistant turn, so a
    base model's `<|endoftext|>` does not close a ChatML turn)."""

    templated = True

    def __init__(self, template: ChatTemplateLike, end_of_turn: str | None = None) -> None:
        self.template = template
        eos = template.special_tokens.get("eos_token")
        self.end_of_turn = end_of_turn or self._first_end_of_turn() or eos

    def prompt(
        self, text: str, tools: Sequence[ToolSpec], messages: list[dict[str, Any]] | None = None
    ) -> str:
        msgs = messages or [{"role": "user", "content": text}]
        return self.template.render(msgs, tools=[t.schema() for t in tools] or None)

    def replies(self, replies: Sequence[ToolReply]) -> str:
        tool = [{"role": "tool", "name": r.name, "content": r.text} for r in replies]
        return self.after_turn(tool)

    def after_turn(self, messages: list[dict[str, str]]) -> str:
        """What the template writes after the model's turn for `messages` following it, up to
        the next assistant turn opened (the generation prompt)."""
        full = self.template.render([*_STAND_IN, *messages])
        end = self._turn_end(full)
        if end is None:
            raise ValueError(
                "chat template: no end-of-turn token after the assistant's turn in a "
                "conversation with replies (such a template needs its own Renderer)"
            )
        return full[end:]

    def _first_end_of_turn(self) -> str | None:
        """The end-of-turn text the template writes first after the stand-in assistant turn."""
        eos = self.template.special_tokens.get("eos_token")
        try:
            text = self.template.render(list(_STAND_IN), add_generation_prompt=False)
        except ValueError:
            return None
        at = text.find(_MARK)
        if at < 0:
            return None
        tail = text[at + len(_MARK) :]
        marks = [m for m in {eos, *_END_OF_TURN} if isinstance(m, str) and m]
        found = [(tail.find(m), -len(m), m) for m in marks if m in tail]
        return min(found)[2] if found else None

    def _turn_end(self, text: str) -> int | None:
        """Where the stand-in assistant turn ends in `text`: after its end-of-turn token.
        Found after the turn's own text, not by comparing renderings with and without the
        tool turns, as a template may render an assistant turn differently when it is the last
        (Qwen3 writes an empty think block into the last one only)."""
        at = text.find(_MARK)
        if at < 0 or not self.end_of_turn:
            return None
        end = text.find(self.end_of_turn, at + len(_MARK))
        return None if end < 0 else end + len(self.end_of_turn)


_MARK = "slipstream-stand-in-turn-7f3a"
_STAND_IN: tuple[dict[str, Any], ...] = (
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": _MARK},
)


def encode_tail(tok: Codec, text: str, templated: bool = False) -> list[int]:
    """`text` as tokens to append inside a sequence: with none of the special tokens the
    tokenizer adds (a BOS, or the EOS of an `add_eos_token` tokenizer, would land mid-sequence).
    `templated`: the text holds its own special tokens, parsed like any added token."""
    return tok.encode(text, add_special_tokens=False)
