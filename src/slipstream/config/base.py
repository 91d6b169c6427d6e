"""The base of every config section, and the error a bad configuration raises."""

from __future__ import annotations

import types
from collections.abc import Collection
from typing import Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError


class ConfigError(ValueError):
    """A bad configuration: the message is one line naming the key and what was expected."""


def _check_name(key: str, value: str, valid: Collection[str]) -> None:
    if value not in valid:
        raise ValueError(f"{key}: unknown {value!r}; valid: {', '.join(valid)}")


def _scalars(annotation: object) -> set[object]:
    """The scalar types a field's annotation takes, through unions and `Literal`s."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return set().union(*map(_scalars, get_args(annotation)))
    if origin is Literal:
        return {type(a) for a in get_args(annotation)}
    return {annotation} if isinstance(annotation, type) else set()


def check_bool_or_number(annotation: object, value: object) -> None:
    """Refuse a boolean where only numbers go and a number where only booleans go (in lists,
    tuples and dict values too): pydantic's lax mode takes `true` as 1 and 1 as true, so
    `run.steps=true` ran one step. PydanticCustomError: pydantic's own type error."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (list, tuple) and isinstance(value, list | tuple) and args:
        for i, v in enumerate(value):
            whole = origin is list or args[-1] is Ellipsis  # one type for every item
            check_bool_or_number(args[0] if whole else args[min(i, len(args) - 1)], v)
        return
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        for v in value.values():
            check_bool_or_number(args[1], v)
        return
    kinds = _scalars(annotation)
    if isinstance(value, bool) and bool not in kinds and int in kinds:
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    if isinstance(value, bool) and bool not in kinds and float in kinds:
        raise PydanticCustomError("float_type", "Input should be a valid number")
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and bool in kinds and not kinds & {int, float}:
        raise PydanticCustomError("bool_type", "Input should be a valid boolean")


class _Section(BaseModel):
    # no setting means anything at infinity or NaN (a bound that is off is 0, not inf): TOML's
    # `inf` and `nan` literals would reach a temperature, a learning rate or a timeout
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _bool_is_no_number(cls, value: object, info: ValidationInfo) -> object:
        """Every field of every section: `check_bool_or_number`."""
        if info.field_name is not None:
            check_bool_or_number(cls.model_fields[info.field_name].annotation, value)
        return value


def check_device_name(value: str) -> str:
    """`cpu`, `cuda` or `cuda:N`: the devices slipstream places models on (availability is
    checked when a run starts, runtime.placement)."""
    kind, _, index = value.partition(":")
    if value == "cpu" or (kind == "cuda" and (not index or index.isdigit())):
        return value
    raise ValueError(f"expected cpu, cuda or cuda:N, got {value!r}")
