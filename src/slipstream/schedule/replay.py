"""Replay of past successes into groups that found none (opt-in).

A hard prompt's group often holds no success: all advantages are 0 and the step learns nothing
from it. Replaying a stored success of the same prompt into such a group restores a learning
signal (RePO, replay-enhanced policy optimisation, 2025; RLEP, RL with experience replay,
2025). A replayed sample
keeps its original `behavior_logp_T` and `versions_T`, so the trainer sees its true lag and
the decoupled correction in `algo.losses` weighs it by its importance ratio like any stale token.

The buffer consumes finished groups (`add`) and rewrites groups before advantages are computed
(`mix_into`). Its only side effect is its own table; its only randomness is the `rng` passed in.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from slipstream.types import FinishReason, Group, Sample


def _copy(sample: Sample) -> Sample:
    """A copy whose lists are not shared, so changing a replayed sample cannot change the store."""
    return replace(
        sample,
        prompt_tokens=list(sample.prompt_tokens),
        completion_tokens=list(sample.completion_tokens),
        behavior_logp_T=list(sample.behavior_logp_T),
        versions_T=list(sample.versions_T),
        kept_logmass_T=None if sample.kept_logmass_T is None else list(sample.kept_logmass_T),
    )


class ReplayBuffer:
    """Up to `capacity_per_prompt` past successes (reward >= `success_threshold`) per prompt id.

    When a prompt has more successes than room, the newest are kept. The same completion is
    stored once, so adding a group that holds a replayed sample does not duplicate it.
    """

    def __init__(self, capacity_per_prompt: int = 4, success_threshold: float = 1.0) -> None:
        if capacity_per_prompt < 1:
            raise ValueError(f"capacity_per_prompt must be >= 1, got {capacity_per_prompt}")
        self.capacity_per_prompt = capacity_per_prompt
        self.success_threshold = success_threshold
        self._store: dict[str, deque[Sample]] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self._store.values())

    def successes(self, prompt_id: str) -> list[Sample]:
        """The stored successes of `prompt_id`, oldest first."""
        return list(self._store.get(prompt_id, ()))

    def add(self, group: Group) -> int:
        """Store the successes of a finished group; returns how many were new."""
        added = 0
        for sample in group.samples:
            if sample.reward < self.success_threshold:
                continue
            q = self._store.setdefault(sample.prompt_id, deque(maxlen=self.capacity_per_prompt))
            if any(s.completion_tokens == sample.completion_tokens for s in q):
                continue
            q.append(_copy(sample))
            added += 1
        return added

    def discard(self, drop: Callable[[Sample], bool]) -> int:
        """Forget the stored samples for which `drop` is True; returns how many."""
        n = 0
        for q in self._store.values():
            keep = [s for s in q if not drop(s)]
            n += len(q) - len(keep)
            q.clear()
            q.extend(keep)
        return n

    def mix_into(
        self, group: Group, k: int = 1, rng: random.Random | None = None
    ) -> tuple[list[Sample], int]:
        """The group's samples with up to `k` of them replaced by stored successes.

        Only a group with no success is changed; the replaced positions and the replayed
        successes are chosen with `rng` (seed it for determinism; None means `Random(0)`).
        Returns `(samples, num_replayed)`; the input group is not modified.
        """
        samples = list(group.samples)
        if k < 1 or any(s.reward >= self.success_threshold for s in samples):
            return samples, 0
        stored = self._store.get(group.prompt.id, ())
        n = min(k, len(stored), len(samples))
        if n == 0:
            return samples, 0
        rng = random.Random(0) if rng is None else rng
        slots = rng.sample(range(len(samples)), n)
        picks = rng.sample(list(stored), n)
        for slot, pick in zip(slots, picks):
            samples[slot] = _copy(pick)
        return samples, n

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot: `{prompt_id: [sample as dict, ...]}`, oldest first."""
        return {
            "samples": {
                pid: [{**asdict(s), "finish_reason": s.finish_reason.value} for s in q]
                for pid, q in self._store.items()
            }
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict()` snapshot, keeping the newest `capacity_per_prompt` each."""
        self._store = {
            pid: deque(
                (Sample(**{**d, "finish_reason": FinishReason(d["finish_reason"])}) for d in items),
                maxlen=self.capacity_per_prompt,
            )
            for pid, items in state["samples"].items()
        }
