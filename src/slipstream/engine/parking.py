"""Parking: a sequence that waits for its environment leaves its slot, and may keep its KV.

A multi-turn episode (schedule.episodes) ends each model turn like any request, at its EOS
token, so its slot is freed at once and refilled by other work: the engine never waits for an
environment. Its continuation comes back later as a new `Request` whose prompt is the whole
history (the previous prompt and turn tokens, then the observation's tokens).

What happens to the finished turn's keys and values (`KVPark`):

- kept when they fit: a `Request` with `park=True` that ends (at EOS or its token budget,
  not by abort) is copied out of its slot into
  the park (`[kv_heads, n, head_dim]` per layer, on the cache's device) if `budget_tokens`
  has room for its `n` cached tokens. When its continuation is admitted and begins with exactly
  those tokens, they are copied into the new slot and only the rest (the turn's last token and
  the observation) is prefilled;
- re-prefilled otherwise: the park is full, the continuation does not extend the parked tokens,
  or (kv_mode `recompute`) the weights changed while it waited: then the whole history is
  prefilled, as for any prompt.

With kv_mode `keep` a parked prefix keeps the keys of the weights that computed them, as an
in-flight sequence does across a weight update. Entries are dropped when their continuation is
admitted, or by `discard` when the episode ends without one.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from slipstream.engine.forward import SlotKV

if TYPE_CHECKING:  # the engine imports this module
    from slipstream.engine.engine import Engine
    from slipstream.engine.request import Request


@dataclass
class _Parked:
    tokens: list[int]  # the tokens whose keys and values these are (positions 0..n-1)
    k: list[torch.Tensor]  # per layer [kv_heads, n, head_dim]
    v: list[torch.Tensor]
    version: int


@dataclass
class ParkStats:
    saved: int = 0  # turns whose KV was parked
    full: int = 0  # turns not parked: no room within the budget
    restored: int = 0  # continuations that found their KV
    missed: int = 0  # continuations re-prefilled though something was parked for them
    reused_tokens: int = 0  # prefill tokens saved by restored KV


class KVPark:
    """The parked keys and values, by request key, within `budget_tokens` cached tokens."""

    def __init__(self, budget_tokens: int) -> None:
        if budget_tokens < 0:
            raise ValueError(f"budget_tokens must be >= 0, got {budget_tokens}")
        self.budget = budget_tokens
        self.used = 0
        self.entries: dict[Hashable, _Parked] = {}
        self.stats = ParkStats()

    def save(
        self, cache: SlotKV, slot: int, tokens: list[int], key: Hashable, version: int
    ) -> bool:
        """Copy slot `slot`'s first `len(tokens)` positions out, if they fit; whether they did."""
        self.discard(key)
        n = len(tokens)
        if n == 0 or self.used + n > self.budget:
            self.stats.full += 1
            return False
        k = [layer[slot, :, :n].clone() for layer in cache.k]
        v = [layer[slot, :, :n].clone() for layer in cache.v]
        self.entries[key] = _Parked(list(tokens), k, v, version)
        self.used += n
        self.stats.saved += 1
        return True

    def restore(
        self, cache: SlotKV, slot: int, key: Hashable, prompt: list[int], version: int, keep: bool
    ) -> int:
        """Copy the parked prefix of `prompt` into `slot`; how many positions it holds (0: none).

        `keep`: the engine keeps KV across weight updates (kv_mode `keep`); otherwise a prefix
        parked under another `version` is not used. One token is always left to prefill, since
        the step samples from the last prompt token's logits.
        """
        e = self.entries.pop(key, None)
        if e is None:
            return 0
        self.used -= len(e.tokens)
        n = len(e.tokens)
        if n >= len(prompt) or prompt[:n] != e.tokens or (not keep and e.version != version):
            self.stats.missed += 1
            return 0
        for layer, saved in zip(cache.k, e.k):
            layer[slot, :, :n] = saved
        for layer, saved in zip(cache.v, e.v):
            layer[slot, :, :n] = saved
        self.stats.restored += 1
        self.stats.reused_tokens += n
        return n

    def restore_all(self, engine: Engine, slots: list[int], requests: list[Request]) -> list[int]:
        """`restore` for each request admitted into `slots` with something parked under its
        key (an episode's last turn parks nothing itself, but its history was parked)."""
        keep, v = engine.kv_mode == "keep", engine.version
        return [
            self.restore(engine.cache, i, r.key, r.prompt_tokens, v, keep) if self._has(r) else 0
            for i, r in zip(slots, requests)
        ]

    def _has(self, r: Request) -> bool:
        try:
            return r.key in self.entries
        except TypeError:  # an unhashable handle (a single-turn request's): nothing parked
            return False

    def discard(self, key: Hashable) -> None:
        """Forget what is parked for `key` (its episode ended, or it is parked anew)."""
        e = self.entries.pop(key, None)
        if e is not None:
            self.used -= len(e.tokens)
