"""A tool argument's type hint as JSON schema, and a value the model sent checked against it.

`type_schema` gives the shape `transformers.utils.get_json_schema` gives for the same hint:

    str, int, float, bool, None      {"type": "string" | "integer" | "number" | "boolean" | "null"}
    list, dict                       {"type": "array"}, {"type": "object"}
    list[int]                        {"type": "array", "items": {"type": "integer"}}
    dict[str, int]                   {"type": "object", "additionalProperties": {"type": "integer"}}
    Literal["a", "b"]                {"type": "string", "enum": ["a", "b"]}
    int | None, Optional[int]        {"type": "integer", "nullable": True}
    int | str                        {"type": ["integer", "string"]}
    int | list[int]                  {"anyOf": [{"type": "integer"}, {"type": "array", ...}]}
    Any                              {}

and None for a hint it cannot write (a custom class, a tuple): such an argument is shown as `{}`
and not checked. `fit` checks a value against such a schema: text is taken for a number (`"5"`
for an `int`), an integer for a `float` is made one; anything else that does not fit is refused.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, Union

Schema = dict[str, Any]  # a JSON schema (its values are nested schemas, lists and names)

_BASIC: dict[object, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
    list: "array",
    dict: "object",
}
_SCALARS = (str, int, float, bool, type(None))  # what a Literal may list (JSON scalars)


class _No:
    """A value that does not fit (None is a value that may)."""


NO = _No()


def type_schema(hint: object) -> Schema | None:
    """The JSON schema of a parameter's type `hint` (module docstring); None: not expressible."""
    if hint is Any:
        return {}
    if isinstance(hint, type) and hint in _BASIC:
        return {"type": _BASIC[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        return _union_schema(args)
    if origin is Literal:
        if not args or any(type(a) not in _SCALARS for a in args):
            return None
        names = list(dict.fromkeys(_BASIC[type(a)] for a in args))
        return {"type": names[0] if len(names) == 1 else names, "enum": list(args)}
    if origin is list:
        item = type_schema(args[0]) if args else {}
        if item is None:
            return None
        return {"type": "array", "items": item} if args else {"type": "array"}
    if origin is dict:
        value = type_schema(args[1]) if len(args) == 2 else {}
        if value is None:
            return None
        return {"type": "object", "additionalProperties": value} if args else {"type": "object"}
    return None


def _union_schema(args: tuple[object, ...]) -> Schema | None:
    subs = [type_schema(a) for a in args if a is not type(None)]
    known = [s for s in subs if s is not None]
    if len(known) < len(subs):
        return None
    if len(known) == 1:
        out = dict(known[0])
    elif all(s.keys() == {"type"} and isinstance(s["type"], str) for s in known):
        names = sorted({s["type"] for s in known})
        out = {"type": names[0] if len(names) == 1 else names}
    else:
        out = {"anyOf": known}
    if type(None) in args:
        out["nullable"] = True
    return out


def fit(schema: Schema, value: object) -> object:
    """`value` as the tool gets it if it fits `schema` (text taken for a number only where
    nothing fits as it is), else `NO`."""
    out = _fit(schema, value, loose=False)
    return _fit(schema, value, loose=True) if out is NO else out


def _fit(s: Schema, v: object, loose: bool) -> object:
    if v is None and s.get("nullable"):
        return v
    if "anyOf" in s:
        return next((o for sub in s["anyOf"] if (o := _fit(sub, v, loose)) is not NO), NO)
    if "enum" in s:  # (True is not 1, nor 1.0 the 1 of Literal[1])
        return v if any(v == e and type(v) is type(e) for e in s["enum"]) else NO
    names = s.get("type")
    if names is None:
        return v
    for name in [names] if isinstance(names, str) else names:
        out = _fit_type(name, s, v, loose)
        if out is not NO:
            return out
    return NO


def _fit_type(name: str, s: Schema, v: object, loose: bool) -> object:
    if name == "array":
        if not isinstance(v, list):
            return NO
        items = [_fit(s.get("items", {}), x, loose) for x in v]
        return NO if any(x is NO for x in items) else items
    if name == "object":
        if not isinstance(v, dict):
            return NO
        vals = {k: _fit(s.get("additionalProperties", {}), x, loose) for k, x in v.items()}
        return NO if any(x is NO for x in vals.values()) else vals
    if name in ("integer", "number"):
        return _number(name, v, loose)
    exact = {"string": str, "boolean": bool, "null": type(None)}.get(name)
    return v if exact is not None and isinstance(v, exact) else NO


def _number(name: str, v: object, loose: bool) -> object:
    """`v` as an int (`integer`) or a float (`number`); text only when `loose`."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        return NO
    if isinstance(v, str) and not loose:
        return NO
    try:
        if name == "integer":
            return v if isinstance(v, int) else int(v) if isinstance(v, str) else NO
        return float(v)  # (an integer past float's range overflows)
    except (ValueError, OverflowError):
        return NO
