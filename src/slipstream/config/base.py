"""The base of every config section, and the error a bad configuration raises."""

from __future__ import annotations

from collections.abc import Collection

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A bad configuration: the message is one line naming the key and what was expected."""


def _check_name(key: str, value: str, valid: Collection[str]) -> None:
    if value not in valid:
        raise ValueError(f"{key}: unknown {value!r}; valid: {', '.join(valid)}")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def check_device_name(value: str) -> str:
    """`cpu`, `cuda` or `cuda:N`: the devices slipstream places models on (availability is
    checked when a run starts, runtime.placement)."""
    kind, _, index = value.partition(":")
    if value == "cpu" or (kind == "cuda" and (not index or index.isdigit())):
        return value
    raise ValueError(f"expected cpu, cuda or cuda:N, got {value!r}")
