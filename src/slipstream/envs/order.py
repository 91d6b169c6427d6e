"""The order in which environment workers run queued operations: oldest episode first."""

from __future__ import annotations

import itertools
from collections.abc import Hashable


class Ranks:
    """Episodes in the order they started (their first observation asked): operations run
    oldest episode first, so the episodes admitted first (the oldest groups, which the trainer
    needs next) are not held up by those admitted after them."""

    def __init__(self) -> None:
        self.ranks: dict[Hashable, int] = {}
        self.started = itertools.count()
        self.arrivals = itertools.count()

    def rank(self, key: Hashable, op: str) -> int:
        """`key`'s rank; a first observation gives it the next one."""
        if op == "first" or key not in self.ranks:
            self.ranks[key] = next(self.started)
        return self.ranks[key]

    def of(self, key: Hashable) -> int:
        """`key`'s rank, without giving one (0: none)."""
        return self.ranks.get(key, 0)

    def arrival(self) -> int:
        return next(self.arrivals)

    def forget(self, key: Hashable) -> None:
        self.ranks.pop(key, None)
