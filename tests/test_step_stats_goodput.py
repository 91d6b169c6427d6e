"""Goodput (`schedule.step_stats.goodput`): a skipped step is no useful work."""

from __future__ import annotations

import pytest

from slipstream.schedule.step_stats import goodput


def test_a_skipped_steps_time_and_tokens_are_not_useful() -> None:
    """Two steps of 2 s training and 4 s generating 100 tokens each, one sampler, 20 s wall
    (40 actor-seconds). The second was skipped as non-finite: its 100 tokens are wasted (the
    loops count them, train.trainer) and its 2 s of training updated nothing. Useful:
    2 s of training + 8 s generating x (1 - 100 / 200) = 6 s, goodput 6 / 40 = 0.15 (it was
    (4 + 4) / 40 = 0.2: the skipped step's training counted as useful)."""
    step = {"time/train_s": 2.0, "time/generate_s": 4.0, "tokens/generated": 100}
    records = [
        {**step, "tokens/wasted": 0, "train/skipped": 0.0},
        {**step, "tokens/wasted": 100, "train/skipped": 1.0},
    ]
    good = goodput(records, wall_s=20.0, samplers=1)
    assert good["useful_s"] == pytest.approx(6.0)
    assert good["goodput"] == pytest.approx(0.15)
