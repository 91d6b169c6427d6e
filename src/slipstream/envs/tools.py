"""The tool layer: a class whose public methods are the tools, as TRL users write them.

    class Calculator:
        def reset(self, **row) -> str | None:   # optional: called once per episode with the row
            self.answer = row["answer"]          # (prompt, answer, and the row's other fields)
        def add(self, a: float, b: float) -> float:
            "Add two numbers."                   # the docstring is the tool's description
            return a + b
        def reward(self, completion: str) -> float:   # optional: scores the final answer
            return float(completion.strip() == str(self.answer))

Every public method but `reset` and `reward` is a tool; its typed arguments become the JSON
schema the model is shown (envs.schema: `Optional[int]`, `list[int]`, `Literal[...]` as
transformers' `get_json_schema` writes them), and the arguments of a call are checked against
it. Any of them may be `async def` (as TRL environments' tools may be): it is awaited on the event loop async `Env`s run on (envs.base: the worker process's, or in
thread workers the environment's own), kept across calls, so what a tool starts (a client, a
subprocess) is there at its next call.
A call with unknown or mistyped arguments, an unknown tool, or a tool that raises is answered
with the error as the tool's reply (`error: ...`), and the episode goes on: the model reads it
like any other output.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from slipstream.envs.base import resolve
from slipstream.envs.parse import ToolCall
from slipstream.envs.schema import NO, fit, type_schema
from slipstream.text import first_line, short_repr

_RESERVED = {"reset", "reward"}


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, description, JSON schema of its parameters, and the bound method."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    types: dict[str, Any]  # parameter name -> its type hint, where its schema checks it

    def schema(self) -> dict[str, Any]:
        """The OpenAI / Hermes function schema (what a tools chat template shows the model)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True)
class ToolReply:
    """A tool's reply as the model will read it; `error` if the call failed."""

    name: str
    text: str
    error: bool = False


def tool_specs(tools: object) -> list[ToolSpec]:
    """The tools of `tools` (an instance): its public methods (static and class methods
    too) except `reset` and `reward`."""
    specs = []
    for name in dir(tools):  # (sorted, as `inspect.getmembers` lists them)
        if name.startswith("_") or name in _RESERVED:
            continue
        static = inspect.getattr_static(tools, name, None)
        # a property is never read to list the tools: it may need what `reset` sets up
        if isinstance(static, property | cached_property):
            continue
        fn = getattr(tools, name, None)
        if inspect.ismethod(fn) or (isinstance(static, staticmethod) and callable(fn)):
            specs.append(_spec(name, fn))
    return specs


def _spec(name: str, fn: Callable[..., Any]) -> ToolSpec:
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: leave the arguments unchecked
        hints = {}
    props: dict[str, Any] = {}
    required = []
    types: dict[str, Any] = {}
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        prop = type_schema(hints[p.name]) if p.name in hints else None
        if prop:  # ({} or None: any value, unchecked)
            types[p.name] = hints[p.name]
        props[p.name] = prop or {}
        if p.default is p.empty:
            required.append(p.name)
    params = {"type": "object", "properties": props, "required": required}
    return ToolSpec(name, inspect.getdoc(fn) or "", params, fn, types)


def call_tool(specs: list[ToolSpec], call: ToolCall) -> ToolReply:
    """Run `call` against `specs`; every failure becomes an error reply, never an exception."""
    if call.error:
        return ToolReply(call.name, f"error: {call.error}", error=True)
    spec = next((s for s in specs if s.name == call.name), None)
    if spec is None:
        names = ", ".join(s.name for s in specs) or "none"
        return ToolReply(call.name, f"error: unknown tool {call.name!r} (tools: {names})", True)
    args = dict(call.arguments)
    if call.text is not None:  # plain format: free text is the first argument
        first = next(iter(spec.parameters["properties"]), None)
        if first is None:
            return ToolReply(call.name, f"error: {call.name} takes no arguments", True)
        args = {first: call.text}
    problem = _check_args(spec, args)
    if problem:
        return ToolReply(call.name, f"error: {problem}", True)
    try:
        out = resolve(spec.fn(**args))  # (an async tool: awaited on the environments' loop)
    except (Exception, SystemExit) as e:  # a tool that raises (or exits) answers with its error
        return ToolReply(call.name, f"error: {type(e).__name__}: {e}", True)
    if isinstance(out, ToolReply):
        return out
    try:
        return ToolReply(call.name, out if isinstance(out, str) else _to_text(out))
    except Exception as e:  # (an int of over 4300 digits, a `__str__` that raises)
        what = f"{type(e).__name__}: {first_line(e)}"
        msg = f"error: the {type(out).__name__} {call.name} returned cannot be shown ({what})"
        return ToolReply(call.name, msg, True)


def _check_args(spec: ToolSpec, args: dict[str, Any]) -> str:
    """'' if `args` fit `spec`, else what is wrong; each checked argument is replaced by
    the value the tool gets (envs.schema.fit: text taken for a number)."""
    props, required = spec.parameters["properties"], spec.parameters["required"]
    unknown = [k for k in args if k not in props]
    if unknown:
        return f"{spec.name} has no argument {unknown[0]!r} (arguments: {', '.join(props)})"
    missing = [k for k in required if k not in args]
    if missing:
        return f"{spec.name} needs argument {missing[0]!r}"
    for k, v in args.items():
        if k not in spec.types:
            continue
        value = fit(props[k], v)
        if value is NO:
            want = _hint_name(spec.types[k])
            return f"argument {k!r} of {spec.name} should be {want}, got {short_repr(v, 60)}"
        args[k] = value
    return ""


def _hint_name(hint: object) -> str:
    """`float`, `int | None`, `list[int]`, `Literal['a', 'b']`: the hint as it is written."""
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _to_text(out: object) -> str:
    try:
        return json.dumps(out, ensure_ascii=False)  # the model reads "Zürich", not "\\u00fc"
    except (TypeError, ValueError):
        return str(out)
