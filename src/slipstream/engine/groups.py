"""Collect completions into groups: a group is released the moment its last member finishes.

Consumes the completions `Engine.step()` returns, in any order and interleaved across groups;
produces each group's completions ordered by member index; waits for nothing (it holds the
partial groups). A member that ended by abort still counts as finished: what to do with an
aborted group is the caller's decision (drop it, or train on it with its ratio corrections).

Each request names its group in `request.key`: a `GroupMember(group, member, size)`, or a
plain tuple `(group, member)` / `(group, member, size)`. `group` is any hashable id, unique per
draw (a prompt drawn twice is two groups); `size` defaults to the collector's `group_size`, so
adaptive group sizes only need it in the key.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import NamedTuple, cast

from slipstream.engine.request import Completion


class GroupMember(NamedTuple):
    """What `Request.key` holds for member `member` (0-based) of a group of `size` samples."""

    group: Hashable
    member: int
    size: int | None = None


class GroupCollector:
    """Partial groups by id; `add` returns the groups its completions finish."""

    def __init__(self, group_size: int | None = None) -> None:
        if group_size is not None and group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.group_size = group_size
        self._partial: dict[Hashable, list[Completion | None]] = {}
        self._missing: dict[Hashable, int] = {}

    @property
    def pending(self) -> int:
        """Groups with at least one member finished and at least one still out."""
        return len(self._partial)

    def add(self, completions: Iterable[Completion]) -> list[list[Completion]]:
        """File `completions`; return every group they complete, in order of completion."""
        out = []
        for c in completions:
            group, index, size = self._member(c)
            members = self._partial.get(group)
            if members is not None and len(members) != size:
                raise ValueError(
                    f"group {group!r}: size {size} but earlier members said {len(members)}"
                )
            if not 0 <= index < size:  # checked before a new group is filed: none is left behind
                raise ValueError(f"group {group!r}: member index {index} outside [0, {size})")
            if members is None:
                members = self._partial[group] = [None] * size
                self._missing[group] = size
            if members[index] is not None:
                raise ValueError(f"group {group!r}: member {index} finished twice")
            members[index] = c
            self._missing[group] -= 1
            if self._missing[group] == 0:
                del self._partial[group], self._missing[group]
                out.append(cast(list[Completion], members))  # all filled
        return out

    def drop(self, group: Hashable) -> list[Completion]:
        """Forget a partial group (its other members were cancelled); return what it had."""
        members = self._partial.pop(group, [])
        self._missing.pop(group, None)
        return [c for c in members if c is not None]

    def _member(self, c: Completion) -> tuple[Hashable, int, int]:
        key = c.request.key
        if not isinstance(key, tuple) or len(key) not in (2, 3):
            raise ValueError(f"request.key must be (group, member[, size]), got {key!r}")
        group, index = key[0], key[1]
        size = key[2] if len(key) == 3 and key[2] is not None else self.group_size
        if size is None:
            raise ValueError(f"group {group!r}: no size in the key and no default group_size")
        return group, int(index), int(size)
