"""The group ledger: every generated group ends in exactly one place.

trained, filtered (with a reason; `skipped_step`: the groups of an optimizer step the trainer
skipped, non-finite or without a trainable token, so they entered no update), stale (dropped
beyond the lag bound), aborted, lost (to a failure, and issued again) or poisoned (lost with its
sampler more than `runtime.max_request_retries` times, and given up); a group the end of a run
cut off is `unfinished` (started, not back) or `in_flight` (back, not trained); `discarded`:
produced by policy versions that a watchdog rollback undid. `balanced()` is the invariant that
tests hold for every schedule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slipstream.types import Group

SKIPPED_STEP = "skipped_step"  # `filtered` reason: the groups of a step the trainer skipped


def trained_groups(kept: Sequence[Group], metrics: Mapping[str, object]) -> Sequence[Group]:
    """The groups an optimizer step on `kept` trained on: none if the trainer skipped it
    (`train/skipped` in its metrics), else all of them."""
    return [] if metrics.get("train/skipped") else kept


@dataclass
class Ledger:
    generated: int = 0
    trained: int = 0
    filtered: Counter[str] = field(default_factory=Counter)
    stale: int = 0
    aborted: int = 0
    lost: int = 0
    poisoned: int = 0  # lost once more than the retries allow: dropped, not issued again
    unfinished: int = 0  # started by a sampler, not back when the run ended
    in_flight: int = 0  # generated, not yet settled (queued at the end of a run)
    discarded: int = 0  # produced by policy versions a watchdog rollback undid
    # multi-turn runs: how each episode of a generated group ended (types.EpisodeStats.end);
    # an aborted group's episodes are counted with it, in `aborted`
    episodes: Counter[str] = field(default_factory=Counter)

    def count_episodes(self, group: Group) -> None:
        self.episodes.update(s.episode.end for s in group.samples if s.episode is not None)

    def count_step(self, kept: Sequence[Group], metrics: Mapping[str, object]) -> None:
        """Settle the groups of one optimizer step: `trained`, or `filtered[SKIPPED_STEP]` when
        the trainer skipped the step (`train/skipped`: its groups entered no update)."""
        n = len(trained_groups(kept, metrics))
        self.trained += n
        if len(kept) > n:
            self.filtered[SKIPPED_STEP] += len(kept) - n

    def settled(self) -> int:
        return (
            self.trained
            + sum(self.filtered.values())
            + self.stale
            + self.aborted
            + self.lost
            + self.poisoned
            + self.unfinished
            + self.discarded
        )

    def balanced(self) -> bool:
        return self.generated == self.settled() + self.in_flight

    def as_dict(self) -> dict[str, Any]:
        return {
            "generated": self.generated,
            "trained": self.trained,
            "filtered": dict(self.filtered),
            "stale": self.stale,
            "aborted": self.aborted,
            "lost": self.lost,
            "poisoned": self.poisoned,
            "unfinished": self.unfinished,
            "in_flight": self.in_flight,
            "discarded": self.discarded,
            "balanced": self.balanced(),
            **({"episodes": dict(self.episodes)} if self.episodes else {}),
        }

    def flat(self) -> dict[str, int]:
        """`ledger/...` metrics for a step record."""
        out = {
            f"ledger/{k}": getattr(self, k)
            for k in ("generated", "trained", "stale", "aborted", "lost", "poisoned", "discarded")
        }
        out["ledger/filtered"] = sum(self.filtered.values())
        return out

    def load(self, d: dict[str, Any]) -> None:
        self.generated, self.trained = d["generated"], d["trained"]
        self.filtered = Counter(d["filtered"])
        self.stale, self.aborted, self.lost = d["stale"], d["aborted"], d["lost"]
        self.poisoned, self.in_flight = d.get("poisoned", 0), d.get("in_flight", 0)
        self.unfinished = d.get("unfinished", 0)
        self.discarded = d.get("discarded", 0)
        self.episodes = Counter(d.get("episodes", {}))
