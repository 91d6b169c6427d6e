"""Tool calls parsed out of a model turn, in one of two documented formats.

`hermes` (Hermes / Qwen2.5 / Qwen3 chat templates with tools)::

    <tool_call>
    {"name": "calc", "arguments": {"expr": "7+9"}}
    </tool_call>

one block per call, `arguments` a JSON object (or a string holding one, as some models write).

`plain`, for models without a tools template (the built-in one): one call per line,

    CALL calc {"expr": "7+9"}      a JSON object of arguments, or
    CALL calc 7+9                  any other text: the tool's only (first) argument
    CALL now                       no arguments

A call that cannot be parsed (bad JSON, no name, a `<tool_call>` never closed, as in a turn cut
by its token budget) is still returned, with `error` set: the tool layer replies with that
error instead of calling anything, so the model learns the format.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

ToolFormat = Literal["hermes", "plain"]

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_PLAIN = re.compile(r"^[ \t]*CALL[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*(.*?)[ \t]*$", re.MULTILINE)


@dataclass
class ToolCall:
    """One parsed call. `text` is set for a plain call whose argument is free text."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    text: str | None = None
    error: str = ""


def parse_tool_calls(text: str, fmt: ToolFormat = "hermes") -> list[ToolCall]:
    """The tool calls in `text`, in order; [] if there are none (the turn is an answer)."""
    if fmt == "hermes":
        calls = [_hermes_call(body) for body in _HERMES.findall(text)]
        if "<tool_call>" in text.rsplit("</tool_call>", 1)[-1]:  # opened after the last close
            calls.append(ToolCall("", error="tool call not closed (no </tool_call> after it)"))
        return calls
    if fmt == "plain":
        return [_plain_call(name, rest) for name, rest in _PLAIN.findall(text)]
    raise ValueError(f"unknown tool call format {fmt!r} (expected 'hermes' or 'plain')")


def _hermes_call(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall("", error=f"tool call is not valid JSON ({e.msg} at char {e.pos})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ToolCall("", error='tool call needs {"name": "...", "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return ToolCall(obj["name"], error="tool call arguments are not a JSON object")
    if not isinstance(args, dict):
        return ToolCall(obj["name"], error="tool call arguments are not a JSON object")
    return ToolCall(obj["name"], args)


def _plain_call(name: str, rest: str) -> ToolCall:
    if not rest:
        return ToolCall(name)
    if rest.startswith("{"):
        try:
            args = json.loads(rest)
        except json.JSONDecodeError as e:
            return ToolCall(name, error=f"arguments are not valid JSON ({e.msg} at char {e.pos})")
        if isinstance(args, dict):
            return ToolCall(name, args)
    return ToolCall(name, text=rest)
