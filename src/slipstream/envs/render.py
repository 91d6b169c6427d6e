"""How tool turns become text: the first prompt (with the tools) and the tool replies.

A `Renderer` is the hook where a model's chat template plugs in. Two are built in:

- `PlainRenderer`: the `plain` call format, for models without a chat template (the built-in
  model): `RESULT <tool>: <reply>` lines after the model's turn;
- `HermesRenderer`: the ChatML strings of the Qwen2.5 / Hermes tools template, written out
  here (system block with `<tools>`, replies in a user turn as `<tool_response>`), for models
  trained on it. Until chat templates are read from the tokenizer, a model with another
  template needs its own `Renderer`.

Replies are rendered as text and tokenized alone, then appended after the model's tokens: the
history is never re-tokenized.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol

from slipstream.envs.tools import ToolReply, ToolSpec


class Codec(Protocol):
    """What the tool layer needs of a tokenizer (model.Tokenizer is one)."""

    bos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class Renderer(Protocol):
    def prompt(self, text: str, tools: Sequence[ToolSpec]) -> str:
        """The text of the episode's first observation: the task prompt, with the tools."""
        ...

    def replies(self, replies: Sequence[ToolReply]) -> str:
        """The text appended after a model turn that called tools."""
        ...


class PlainRenderer:
    """The plain format. `describe_tools=False` shows no tool list (a model trained on one
    task's tools, as the built-in task's, does not need it)."""

    def __init__(self, describe_tools: bool = True) -> None:
        self.describe_tools = describe_tools

    def prompt(self, text: str, tools: Sequence[ToolSpec]) -> str:
        if not self.describe_tools or not tools:
            return text
        lines = ["Tools:"]
        for t in tools:
            args = ", ".join(t.parameters["properties"])
            lines.append(f"- {t.name}({args}): {t.description}")
        lines.append('Call a tool on its own line: CALL <tool> {"<argument>": <value>, ...}')
        return "\n".join(lines) + "\n" + text

    def replies(self, replies: Sequence[ToolReply]) -> str:
        return "".join(f"\nRESULT {r.name}: {r.text}" for r in replies) + "\n"


class HermesRenderer:
    """Qwen2.5 / Hermes ChatML with tools (the model's turn ends with `<|im_end|>`, its EOS)."""

    def __init__(self, system: str = "You are a helpful assistant.") -> None:
        self.system = system

    def prompt(self, text: str, tools: Sequence[ToolSpec]) -> str:
        sys = self.system
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
        return (
            f"<|im_start|>system\n{sys}<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n"
            "<|im_start|>assistant\n"
        )

    def replies(self, replies: Sequence[ToolReply]) -> str:
        body = "\n".join(f"<tool_response>\n{r.text}\n</tool_response>" for r in replies)
        return f"\n<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n"


def encode_tail(tok: Codec, text: str) -> list[int]:
    """`text` as tokens to append inside a sequence: without the beginning-of-sequence token."""
    ids = tok.encode(text)
    return ids[1:] if tok.bos_id is not None and ids[:1] == [tok.bos_id] else ids
