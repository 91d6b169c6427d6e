"""The five schedules of the field as settings of one orchestrator.

| preset | weight sync | max lag | batching | prompt order |
| --- | --- | --- | --- | --- |
| `sync` | between batches | 0 | fixed batch | as drawn |
| `tail_batching` | between batches | 0 | fixed batch | sorted by expected length |
| `double_buffer` | between batches | 1 | fixed batch | as drawn |
| `async` | between batches | K | continuous | as drawn |
| `pipeline` | in flight | K | continuous | as drawn |

The real orchestrator and the simulator (`slipstream.sim`) read the same `ScheduleSpec`, so
a prediction and a measurement always describe the same schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

WeightSync = Literal["between_batches", "in_flight"]
Batching = Literal["fixed", "continuous"]
PromptOrder = Literal["as_drawn", "by_expected_length"]


@dataclass(frozen=True)
class ScheduleSpec:
    """What a schedule decides: when weights move, how stale data may be, how work is cut."""

    name: str
    weight_sync: WeightSync
    """`between_batches`: samplers take new weights only when idle between batches.
    `in_flight`: new weights are loaded between two decode steps (PipelineRL)."""
    max_lag: int
    """K: the largest `trainer_version - token_version` the trainer accepts."""
    batching: Batching
    """`fixed`: a sampler generates a whole batch and waits for its longest sample.
    `continuous`: a finished sequence's slot is refilled at once."""
    prompt_order: PromptOrder
    """`by_expected_length`: tail batching sorts drawn prompts by expected completion length
    (learned from what was generated so far), so short ones run together."""

    def with_max_lag(self, k: int) -> ScheduleSpec:
        if k < 0:
            raise ValueError(f"max_lag must be >= 0, got {k}")
        if self.name in ("sync", "tail_batching") and k != 0:
            raise ValueError(f"schedule {self.name!r} is synchronous: max_lag must be 0")
        return replace(self, max_lag=k)


DEFAULT_MAX_LAG = 4

PRESETS: dict[str, ScheduleSpec] = {
    "sync": ScheduleSpec("sync", "between_batches", 0, "fixed", "as_drawn"),
    "tail_batching": ScheduleSpec(
        "tail_batching", "between_batches", 0, "fixed", "by_expected_length"
    ),
    "double_buffer": ScheduleSpec("double_buffer", "between_batches", 1, "fixed", "as_drawn"),
    "async": ScheduleSpec("async", "between_batches", DEFAULT_MAX_LAG, "continuous", "as_drawn"),
    "pipeline": ScheduleSpec("pipeline", "in_flight", DEFAULT_MAX_LAG, "continuous", "as_drawn"),
}


def preset(name: str, max_lag: int | None = None) -> ScheduleSpec:
    """The preset called `name`, with `max_lag` overriding K where the preset allows it."""
    if name not in PRESETS:
        raise ValueError(f"unknown schedule {name!r}; valid: {', '.join(PRESETS)}")
    spec = PRESETS[name]
    if max_lag is not None and max_lag != spec.max_lag:
        spec = spec.with_max_lag(max_lag)
    return spec
