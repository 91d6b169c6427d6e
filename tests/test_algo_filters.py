"""Filters: predicates, the overlong shaping goldens, the registry, and the pass-rate tracker."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.algo import advantages, filters
from slipstream.schedule.pass_rate import PassRateTracker


def test_zero_variance() -> None:
    assert filters.zero_variance([1.0, 1.0, 1.0])
    assert filters.zero_variance(torch.tensor([0.0, 0.0]))
    assert filters.zero_variance([])
    assert not filters.zero_variance([1.0, 0.0, 1.0])


@given(rewards=st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=2, max_size=8))
@settings(max_examples=60, deadline=None)
def test_zero_variance_drops_exactly_the_groups_without_gradient(rewards: list[float]) -> None:
    adv = advantages.compute(torch.tensor([rewards]), "grpo")
    assert filters.zero_variance(rewards) == bool((adv == 0).all())


@pytest.mark.parametrize(
    ("rate", "inside"),
    [
        (0.0, False),
        (0.05, False),
        (0.06, True),
        (0.5, True),
        (0.89, True),
        (0.9, False),
        (1.0, False),
    ],
)
def test_pass_rate_band_bounds_are_exclusive(rate: float, inside: bool) -> None:
    assert filters.in_pass_rate_band(rate) is inside
    assert filters.should_draw(rate) == ((True, "in_band") if inside else (False, "pass_rate_band"))


def test_pass_rate_band_validates() -> None:
    with pytest.raises(ValueError, match="low < high"):
        filters.in_pass_rate_band(0.5, low=0.9, high=0.1)


def test_overlong_penalty_golden() -> None:
    # max_len 10, cache 4: 0 up to 6, then (6 - L) / 4: L=7 -> -0.25, L=8 -> -0.5, L=10 -> -1,
    # and -1 beyond.
    lengths = torch.tensor([3, 6, 7, 8, 10, 12])
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    torch.testing.assert_close(filters.overlong_penalty(lengths, 10, 4), expected)
    # No cache: a hard step at max_len, where the engine stops a completion (before, only
    # beyond it, a length the engine never produces: the penalty never fired)
    torch.testing.assert_close(
        filters.overlong_penalty(torch.tensor([9, 10, 11]), 10, 0), torch.tensor([0.0, -1.0, -1.0])
    )
    with pytest.raises(ValueError, match="cache_len"):
        filters.overlong_penalty(lengths, 4, 10)


def test_overlong_mask_keeps_finished_completions() -> None:
    kept = filters.overlong_mask(torch.tensor([3, 9, 10, 11]), max_len=10)
    assert kept.tolist() == [True, True, False, False]


def test_dynamic_sampling_done() -> None:
    assert not filters.dynamic_sampling_done(3, 4, extra_draws=2, max_extra_draws=8)
    assert filters.dynamic_sampling_done(4, 4, extra_draws=0, max_extra_draws=8)
    assert filters.dynamic_sampling_done(1, 4, extra_draws=8, max_extra_draws=8)


def test_registry_and_reasons() -> None:
    assert set(filters.FILTERS) == {
        "zero_variance",
        "pass_rate_band",
        "dynamic_sampling",
        "overlong",
    }
    assert filters.check(["overlong", "zero_variance"]) == ("overlong", "zero_variance")
    with pytest.raises(ValueError, match="zero_variance, pass_rate_band"):
        filters.check(["zero_var"])
    assert filters.group_drop_reason([1.0, 1.0], ["zero_variance"]) == filters.ZERO_VARIANCE
    assert filters.group_drop_reason([1.0, 1.0], []) is None
    assert filters.group_drop_reason([1.0, 0.0], ["zero_variance"]) is None


def test_tracker_counts_and_band() -> None:
    tracker = PassRateTracker(low=0.05, high=0.9)
    assert tracker.should_draw("p") == (True, "unseen")
    tracker.update("p", [1.0, 1.0, 1.0, 1.0])  # 4/4: mastered
    tracker.update("q", [1.0, 0.0, 0.0, 0.0])  # 1/4
    tracker.update("q", [1.0, 1.0, 0.0, 0.0])  # 3/8 overall
    assert tracker.should_draw("p") == (False, filters.PASS_RATE_BAND)
    assert tracker.pass_rate("q") == pytest.approx(3 / 8)
    assert tracker.should_draw("q") == (True, "in_band")
    assert tracker.pass_rate("never", default=0.5) == 0.5


def test_tracker_ema_and_min_attempts() -> None:
    # decay 0.5: groups with rates 0 then 1 -> 0.5 * 0 + 0.5 * 1 = 0.5; a third at 1 -> 0.75.
    tracker = PassRateTracker(ema_decay=0.5, min_attempts=12)
    for rewards in ([0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]):
        tracker.update("p", rewards)
    assert tracker.pass_rate("p") == pytest.approx(0.75)
    tracker.update("hopeless", [0.0] * 8)
    assert tracker.should_draw("hopeless") == (True, "unseen")  # 8 < 12 attempts
    tracker.update("hopeless", [0.0] * 8)
    assert tracker.should_draw("hopeless") == (False, filters.PASS_RATE_BAND)


def test_tracker_state_round_trip() -> None:
    tracker = PassRateTracker(success_threshold=0.5)
    tracker.update("a", [0.6, 0.2])
    tracker.update("b", [0.0, 0.0, 0.0])
    restored = PassRateTracker(success_threshold=0.5)
    restored.load_state_dict(tracker.state_dict())
    assert restored.state_dict() == tracker.state_dict()
    assert restored.pass_rate("a") == 0.5 and len(restored) == 2


def test_tracker_retry_after_re_admits_an_excluded_prompt() -> None:
    tracker = PassRateTracker(retry_after=2)
    tracker.update("h", [0.0] * 8)
    assert [tracker.should_draw("h")[1] for _ in range(6)] == [filters.PASS_RATE_BAND] * 2 + [
        "retry"
    ] + [filters.PASS_RATE_BAND] * 2 + ["retry"]
    tracker.update("h", [0.0] * 8)  # 0/16: still hopeless; a new group resets the skips
    assert tracker.should_draw("h") == (False, filters.PASS_RATE_BAND)
    with pytest.raises(ValueError, match="retry_after"):
        PassRateTracker(retry_after=-1)
