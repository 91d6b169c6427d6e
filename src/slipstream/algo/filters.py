"""Decisions about what reaches the gradient: pure predicates and small reward shapers.

Each filter has a name, which is also the reason recorded when it drops something, and a
stage where the orchestrator applies it:

- `zero_variance` (group): a group whose rewards are all equal has advantage 0 under every
  method and carries no gradient (DAPO §3.2).
- `pass_rate_band` (draw): a prompt whose running pass rate is at or above `high` (mastered) or
  at or below `low` (hopeless) is not drawn, which saves generation, not only training.
- `dynamic_sampling` (batch): keep drawing prompts until the batch holds B informative groups,
  with a bound on extra draws (DAPO §3.2).
- `overlong` (sample): mask or softly penalise truncated completions (DAPO §3.4).

The orchestrator counts every drop with its reason; this module holds no state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from slipstream.types import FinishReason, Group

ZERO_VARIANCE = "zero_variance"
PASS_RATE_BAND = "pass_rate_band"
DYNAMIC_SAMPLING = "dynamic_sampling"
OVERLONG = "overlong"


@dataclass(frozen=True)
class Filter:
    """A registered filter: where it acts and what it does."""

    name: str
    stage: str  # "draw", "sample", "group" or "batch"
    doc: str


FILTERS: dict[str, Filter] = {
    f.name: f
    for f in (
        Filter(ZERO_VARIANCE, "group", "drop a group whose rewards are all equal"),
        Filter(PASS_RATE_BAND, "draw", "skip prompts whose pass rate is outside (low, high)"),
        Filter(DYNAMIC_SAMPLING, "batch", "draw until the batch holds B informative groups"),
        Filter(OVERLONG, "sample", "mask or penalise truncated completions"),
    )
}


def check(names: Sequence[str]) -> tuple[str, ...]:
    """The filter names of a config, validated: an unknown name raises `ValueError`."""
    unknown = [n for n in names if n not in FILTERS]
    if unknown:
        raise ValueError(f"unknown filter {unknown}; valid: {', '.join(FILTERS)}")
    return tuple(names)


def zero_variance(rewards_G: Sequence[float] | Tensor) -> bool:
    """True (drop) when every reward of the group is equal, or the group is empty."""
    r = torch.as_tensor(rewards_G)
    return bool((r == r.flatten()[0]).all()) if r.numel() else True


def in_pass_rate_band(pass_rate: float, low: float = 0.05, high: float = 0.9) -> bool:
    """True (keep drawing) when `low < pass_rate < high`; False at or beyond either bound."""
    if not 0 <= low < high <= 1:
        raise ValueError(f"pass-rate band needs 0 <= low < high <= 1, got ({low}, {high})")
    return low < pass_rate < high


def group_drop_reason(rewards_G: Sequence[float] | Tensor, enabled: Sequence[str]) -> str | None:
    """The reason to drop a finished group under the `enabled` filters, or None to keep it."""
    if ZERO_VARIANCE in check(enabled) and zero_variance(rewards_G):
        return ZERO_VARIANCE
    return None


def overlong_penalty(lengths: Tensor, max_len: int, cache_len: int) -> Tensor:
    """DAPO's soft overlong punishment (§3.4), added to the reward: `[B]` lengths -> `[B]`.

    `0` for `L <= max_len - cache_len`, then `(max_len - cache_len - L) / cache_len` down to
    `-1` at `L = max_len`, and `-1` beyond. `cache_len=0` makes it a hard step at `max_len`
    (`-1` from `L = max_len` on: the engine stops a completion there, so never beyond it).
    """
    if not 0 <= cache_len <= max_len:
        raise ValueError(f"need 0 <= cache_len <= max_len, got {cache_len} and {max_len}")
    lengths = torch.as_tensor(lengths, dtype=torch.float32)
    if cache_len == 0:
        return torch.where(lengths >= max_len, -1.0, 0.0)
    start = max_len - cache_len
    return ((start - lengths) / cache_len).clamp(-1.0, 0.0)


def overlong_mask(lengths: Tensor, max_len: int) -> Tensor:
    """`[B]` bool, True where a sample keeps its loss: False for completions that reached
    `max_len` (truncated; DAPO §3.4 overlong filtering masks them so an unfinished answer is
    not punished for its reasoning)."""
    return torch.as_tensor(lengths) < max_len


def without_truncated(group: Group) -> Group:
    """`group` (advantages set) less its truncated samples and their advantages: overlong
    `mask_loss`, TRL's `mask_truncated_completions`, where a truncated completion's reward is
    in the statistics of its group's advantages and its loss mask is all zero. A row whose
    loss mask is all zero adds nothing to the loss nor to the token count, so leaving it out
    of the trained group is that mask, without its forward pass; but TRL's per-sequence
    normalisers (loss_type `grpo`, `dr_grpo`) count it as a sequence of the batch, so the new
    group counts it in `masked`, which the trainer adds to the step's sequences
    (docs/algorithms.md, "Aggregation"). `group` itself when none is truncated."""
    if group.advantages_G is None:
        raise ValueError(f"group of prompt {group.prompt.id!r}: advantages not computed")
    keep = [s.finish_reason != FinishReason.LENGTH for s in group.samples]
    if all(keep):
        return group
    pairs = [(s, a) for s, a, k in zip(group.samples, group.advantages_G, keep) if k]
    masked = group.masked + len(group.samples) - len(pairs)
    return Group(group.prompt, [s for s, _ in pairs], [a for _, a in pairs], masked)


def dynamic_sampling_done(
    num_informative: int, batch_size: int, extra_draws: int, max_extra_draws: int
) -> bool:
    """True when drawing should stop: the batch holds `batch_size` informative groups, or
    `max_extra_draws` prompts beyond the first `batch_size` have been drawn (then the step
    trains on what it has)."""
    return num_informative >= batch_size or extra_draws >= max_extra_draws


def should_draw(pass_rate: float | None, low: float = 0.05, high: float = 0.9) -> tuple[bool, str]:
    """Draw decision for one prompt: `(draw, reason)`. Unseen prompts (None) are always drawn;
    a dropped prompt's reason is `PASS_RATE_BAND`."""
    if pass_rate is None:
        return True, "unseen"
    if in_pass_rate_band(pass_rate, low, high):
        return True, "in_band"
    return False, PASS_RATE_BAND
