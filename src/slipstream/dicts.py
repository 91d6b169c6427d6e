"""Nested settings (a config's tables) compared by their dotted names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def changed_keys(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted names (`trainer.lr`) of the settings that differ between two nested tables,
    sorted; where one side lacks a table or holds something else in its place, the table's
    own name."""
    out = []
    for k in sorted(a.keys() | b.keys()):
        x, y = a.get(k), b.get(k)
        if isinstance(x, Mapping) and isinstance(y, Mapping):
            out += changed_keys(x, y, f"{prefix}{k}.")
        elif x != y:
            out.append(prefix + k)
    return out
