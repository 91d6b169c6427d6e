"""Metric values carry their reduction: merging in any split gives the one-pass value."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slipstream.observe.metrics import (
    Last,
    Max,
    Mean,
    Metric,
    Min,
    Sum,
    default_reduction,
    lift,
    merge,
    reduce_all,
    resolve,
)


def test_mean_of_means_is_weighted_not_averaged() -> None:
    # Micro-batch A: 10 tokens of mean 0.5 (sum 5); B: 30 tokens of mean 1.0 (sum 30).
    # Exact: 35 / 40 = 0.875. Averaging the two means would give 0.75.
    merged = Mean.of(0.5, 10) + Mean.of(1.0, 30)
    assert merged == Mean(35.0, 40.0)
    assert merged.value() == 0.875


def test_kinds_merge_by_their_reduction() -> None:
    assert (Sum(3) + Sum(4)).value() == 7
    assert (Max(3) + Max(-1)).value() == 3
    assert (Min(3) + Min(-1)).value() == -1
    assert (Last(1.0, at=5) + Last(2.0, at=4)).value() == 1.0  # the newer reading wins
    assert (Last(1.0, at=4) + Last(2.0, at=4)).value() == 2.0  # a tie goes to the later part
    assert sum([Mean(1, 1), Mean(3, 1)]) == Mean(4, 2)  # sum() starts from 0


def test_empty_mean_is_nan_and_nan_never_wins_a_max() -> None:
    assert math.isnan(Mean(0.0, 0.0).value())
    assert (Max(math.nan) + Max(2.0)).value() == 2.0
    assert (Max(2.0) + Max(math.nan)).value() == 2.0


def test_merging_different_kinds_is_refused() -> None:
    with pytest.raises(TypeError, match="cannot merge Mean with Max"):
        Mean(1, 1) + Max(1)  # type: ignore[operator]
    with pytest.raises(ValueError, match="no metric values"):
        merge([])


def _make(kind: str, x: int, i: int) -> Metric:
    return {
        "mean": lambda: Mean(float(x), float(1 + i % 3)),
        "sum": lambda: Sum(float(x)),
        "max": lambda: Max(float(x)),
        "min": lambda: Min(float(x)),
        "last": lambda: Last(float(x), at=float(i)),
    }[kind]()


def _split(xs: list[Metric], cuts: list[int]) -> list[list[Metric]]:
    bounds = sorted({c % (len(xs) + 1) for c in cuts} | {0, len(xs)})
    return [xs[a:b] for a, b in itertools.pairwise(bounds) if b > a]


KIND = st.sampled_from(["mean", "sum", "max", "min", "last"])
# Integer values keep float sums exact, so equality (not closeness) is asserted.
VALUES = st.lists(st.integers(-1000, 1000), min_size=1, max_size=40)


@given(KIND, VALUES, st.lists(st.integers(0, 40), max_size=8))
def test_any_split_merges_to_the_one_pass_value(kind: str, xs: list[int], cuts: list[int]) -> None:
    parts = [_make(kind, x, i) for i, x in enumerate(xs)]
    one_pass = merge(parts)
    # micro-batches / samplers / windows of time: merge each chunk, then the chunks
    chunked = merge(merge(chunk) for chunk in _split(parts, cuts))
    assert chunked == one_pass


@given(KIND, VALUES, st.randoms(use_true_random=False))
def test_merge_order_does_not_matter(kind: str, xs: list[int], rnd) -> None:  # type: ignore[no-untyped-def]
    # Last orders by `at`, not by arrival: samplers may report out of order.
    parts = [_make(kind, x, i) for i, x in enumerate(xs)]
    shuffled = parts[:]
    rnd.shuffle(shuffled)
    assert merge(shuffled).value() == merge(parts).value()


@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.floats(1, 1e4)), min_size=1, max_size=30))
def test_mean_equals_weighted_average_of_floats(parts: list[tuple[float, float]]) -> None:
    naive = sum(m * w for m, w in parts) / sum(w for _, w in parts)
    merged = merge(Mean.of(m, w) for m, w in parts).value()
    assert merged == pytest.approx(naive, rel=1e-9, abs=1e-6)


@given(
    st.lists(st.dictionaries(st.sampled_from("abc"), st.integers(0, 100), max_size=3), max_size=6)
)
def test_reduce_all_merges_key_by_key_over_records_that_have_the_key(
    records: list[dict[str, int]],
) -> None:
    merged = reduce_all([{k: Sum(float(v)) for k, v in r.items()} for r in records])
    expected = {k: float(sum(r[k] for r in records if k in r)) for r in records for k in r}
    assert {k: m.value() for k, m in merged.items()} == expected


def test_resolve_turns_metrics_into_numbers_and_keeps_the_rest() -> None:
    rec = {"train/loss": Mean(3.0, 2.0), "step": 4, "completion_lens": [1, 2]}
    assert resolve(rec) == {"train/loss": 1.5, "step": 4, "completion_lens": [1, 2]}


def test_default_reductions_of_the_sync_loop_record() -> None:
    assert default_reduction("reward_mean") == "mean"
    assert default_reduction("engine/tokens_per_s") == "mean"
    assert default_reduction("completion_len_max") == "max"
    assert default_reduction("staleness/lag_max") == "max"
    assert default_reduction("tokens/generated") == "sum"
    assert default_reduction("time/train_s") == "sum"
    assert default_reduction("ledger/trained") == "last"  # cumulative counter
    assert default_reduction("queue/depth") == "last"  # gauge
    assert default_reduction("version") == "last"


def test_lift_a_plain_record_then_merge_two_steps() -> None:
    step1 = {
        "step": 1,
        "reward_mean": 0.25,
        "tokens/generated": 100,
        "completion_len_max": 30,
        "ledger/trained": 3,
        "completion_lens": [1, 2],
        "note": "x",
        "ok": True,
    }
    step2 = {
        "step": 2,
        "reward_mean": 0.75,
        "tokens/generated": 50,
        "completion_len_max": 12,
        "ledger/trained": 5,
    }
    merged = reduce_all([lift(step1, at=1), lift(step2, at=2)])
    assert resolve(merged) == {
        "step": 2.0,
        "reward_mean": 0.5,
        "tokens/generated": 150.0,
        "completion_len_max": 30.0,
        "ledger/trained": 5.0,
    }


def test_lift_uses_the_reductions_given_and_weights_means() -> None:
    # algo.losses.METRIC_REDUCTIONS style: means weighted by the micro-batch's tokens.
    reductions = {"clip_frac": "mean", "ratio_max": "max", "tokens": "sum"}
    a = lift({"clip_frac": 0.1, "ratio_max": 1.2, "tokens": 10.0}, reductions, weight=10)
    b = lift({"clip_frac": 0.3, "ratio_max": 1.1, "tokens": 30.0}, reductions, weight=30)
    # (0.1 * 10 + 0.3 * 30) / 40 = 10 / 40 = 0.25
    assert resolve(reduce_all([a, b])) == pytest.approx(
        {"clip_frac": 0.25, "ratio_max": 1.2, "tokens": 40.0}
    )
    with pytest.raises(ValueError, match="'x': unknown reduction 'median'"):
        lift({"x": 1.0}, {"x": "median"})
