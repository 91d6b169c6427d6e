"""Tool calls parsed out of a model turn, in one of three documented formats.

`hermes` (Hermes / Qwen2.5 / Qwen3 chat templates with tools)::

    <tool_call>
    {"name": "calc", "arguments": {"expr": "7+9"}}
    </tool_call>

one block per call, `arguments` a JSON object (or a string holding one, as some models write;
`parameters` is taken for `arguments`, in every JSON format here).
A block whose body starts with a JSON object ends at the first `</tool_call>` after that object,
so the tag written inside one of its strings (code that prints it) does not close it.

`json` (Llama 3.1 / 3.2 / 3.3 chat templates with tools, which ask for a bare JSON object): a
turn that is, stripped, one JSON object with `name` and `parameters` (or `arguments`)::

    {"name": "calc", "parameters": {"expr": "7+9"}}

is one call; any other turn is the answer, except one that opens such an object (`{"name":`)
and is not one (bad JSON, or a turn cut by its token budget): a bad call.

`plain`, for models without a tools template (the built-in one): one call per line,

    CALL calc {"expr": "7+9"}      a JSON object of arguments, or
    CALL calc 7+9                  any other text: the tool's only (first) argument
    CALL now                       no arguments

An argument that starts with `{` is always read as the JSON object of arguments, and is a bad
call if it is not one: text that starts with `{` (code such as `{1: 2}`) goes inside one,
`CALL python {"code": "{1: 2}"}` (the error reply says so).

A call that cannot be parsed (bad JSON, no name, a `<tool_call>` never closed, as in a turn cut
by its token budget) is still returned, with `error` set: the tool layer replies with that
error instead of calling anything, so the model learns the format.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

ToolFormat = Literal["hermes", "json", "plain"]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_SPACE = re.compile(r"\s*")
_JSON = json.JSONDecoder()
_ARGS = {"arguments", "parameters"}
_JSON_CALL = re.compile(r'\{\s*"name"\s*:')  # how a `json` call opens
_BRACE = 'text that starts with "{" goes as a JSON object: {"<argument>": "<text>"}'
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
        return _hermes_calls(text)
    if fmt == "json":
        return _json_turn(text.strip())
    if fmt == "plain":
        return [_plain_call(name, rest) for name, rest in _PLAIN.findall(text)]
    raise ValueError(f"unknown tool call format {fmt!r} (expected 'hermes', 'json' or 'plain')")


def _json_turn(text: str) -> list[ToolCall]:
    """The `json` format: the whole turn is one call, or none (module docstring)."""
    try:
        obj = json.loads(text)
    except ValueError as e:  # (bad JSON, or an integer past int()'s digit limit)
        if not _JSON_CALL.match(text):
            return []
        return [ToolCall("", error=f"tool call is not valid JSON ({_why(e)})")]
    if not isinstance(obj, dict) or "name" not in obj or not _ARGS & obj.keys():
        return []  # (a JSON answer, `{"name": "Paris"}`)
    return [_call(obj)]


def _hermes_calls(text: str) -> list[ToolCall]:
    calls, pos = [], 0
    while (start := text.find(_OPEN, pos)) >= 0:
        body = start + len(_OPEN)
        end = _block_end(text, body)
        if end < 0:  # opened, never closed (a turn cut by its token budget)
            calls.append(ToolCall("", error="tool call not closed (no </tool_call> after it)"))
            break
        calls.append(_hermes_call(text[body:end]))
        pos = end + len(_CLOSE)
    return calls


def _block_end(text: str, body: int) -> int:
    """Where the `</tool_call>` closing the block whose body starts at `body` is (-1: none):
    the first after the JSON object the body starts with, if it starts with one."""
    m = _SPACE.match(text, body)
    after = body  # not JSON: the first tag closes it, and the body is reported as bad JSON
    if m is not None and text.startswith("{", m.end()):
        with contextlib.suppress(ValueError):  # (bad JSON, or an integer `_why` names)
            after = _JSON.raw_decode(text, m.end())[1]
    return text.find(_CLOSE, after)


def _hermes_call(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except ValueError as e:
        return ToolCall("", error=f"tool call is not valid JSON ({_why(e)})")
    return _call(obj)


def _why(e: ValueError) -> str:
    """What `json.loads` refused: bad JSON where, or (a plain ValueError) an integer of more
    digits than `int()` reads (4300 by default: a model repeating a digit for a whole turn)."""
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at char {e.pos}"
    return str(e).split(":")[0]  # ("Exceeds the limit (4300 digits) for integer string ...")


def _call(obj: object) -> ToolCall:
    """The call a parsed JSON value is: `{"name": ..., "arguments" (or "parameters"): {...}}`."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ToolCall("", error='tool call needs {"name": "...", "arguments": {...}}')
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
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
        except ValueError as e:
            why = f"arguments are not valid JSON ({_why(e)})"
            hint = isinstance(e, json.JSONDecodeError)  # (not JSON at all: it may be text)
            return ToolCall(name, error=f"{why}; {_BRACE}" if hint else why)
        if isinstance(args, dict):
            return ToolCall(name, args)
    return ToolCall(name, text=rest)
