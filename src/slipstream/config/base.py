"""The base of every config section, and the error a bad configuration raises."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A bad configuration: the message is one line naming the key and what was expected."""


def _check_name(key: str, value: str, valid: Any) -> None:
    if value not in valid:
        raise ValueError(f"{key}: unknown {value!r}; valid: {', '.join(valid)}")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
