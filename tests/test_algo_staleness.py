"""Staleness: ESS goldens and bounds, VCPO scale, sequence log-ratios, lag statistics."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.algo import staleness

SETTINGS = settings(max_examples=60, deadline=None)


def test_ess_golden() -> None:
    # w = [1, 1, 1, 1]: (4)^2 / (4 * 4) = 1.
    assert staleness.ess(torch.zeros(4)) == pytest.approx(1.0)
    # w = [1, 3]: (1 + 3)^2 / (2 * (1 + 9)) = 16 / 20 = 0.8.
    assert staleness.ess(torch.tensor([0.0, math.log(3)])) == pytest.approx(0.8)
    # w = [1, 3, e^40 masked out]: the mask keeps 0.8.
    lr = torch.tensor([0.0, math.log(3), 40.0])
    assert staleness.ess(lr, torch.tensor([True, True, False])) == pytest.approx(0.8)


def test_ess_does_not_overflow() -> None:
    # w = [e^1000, e^1000, ~0]: two equal weights dominate, ess -> 4 / (3 * 2) = 2/3.
    assert staleness.ess(torch.tensor([1000.0, 1000.0, -1000.0])) == pytest.approx(2 / 3)


def test_ess_of_nothing_is_one() -> None:
    assert staleness.ess(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool)) == 1.0


@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 50),
    scale=st.floats(0.0, 300.0),
)
@SETTINGS
def test_ess_lies_in_unit_interval(seed: int, n: int, scale: float) -> None:
    g = torch.Generator().manual_seed(seed)
    lr = scale * torch.randn(2, n, generator=g, dtype=torch.float64)
    mask = torch.rand(2, n, generator=g) < 0.8
    value = staleness.ess(lr, mask)
    assert 0.0 < value <= 1.0
    # Scale invariance: multiplying every weight by a constant changes nothing.
    assert staleness.ess(lr + 7.0, mask) == pytest.approx(value, rel=1e-6)


def test_seq_log_ratio_sums_masked_tokens_only() -> None:
    old = torch.tensor([[-1.0, -2.0, math.nan], [-0.5, -0.5, -0.5]])
    beh = torch.tensor([[-1.5, -2.5, 0.0], [-0.5, -1.0, -0.5]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    torch.testing.assert_close(staleness.seq_log_ratio(old, beh, mask), torch.tensor([1.0, 0.5]))


def test_a_sequence_log_ratio_sums_its_finite_tokens() -> None:
    """A sequence is made of its finite tokens, as in the loss (`losses.finite_tokens`): one
    -inf behaviour log-prob (a nan, an inf proximal log-prob) made its ratio inf or nan, and
    the ESS and VCPO dropped the whole sequence (here ess 1 over the one left: a full step)."""
    inf, nan = math.inf, math.nan
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [-1.0, -0.75, inf]])
    beh = torch.tensor([[-1.5, -inf, -1.0], [-1.0, -1.0 - math.log(3), -1.0], [nan, -1.0, -1.0]])
    mask = torch.ones(3, 3, dtype=torch.bool)
    # Finite differences: [0.5, 0] -> 0.5; [0, ln 3, 0] -> ln 3; [0.25] -> 0.25.
    seq = staleness.seq_log_ratio(old, beh, mask)
    torch.testing.assert_close(seq, torch.tensor([0.5, math.log(3), 0.25]))
    # Rows 0 and 1: w = [e^0.5, 3], ess = (1.648721 + 3)^2 / (2 (2.718282 + 9))
    # = 21.610610 / 23.436564 = 0.922090; VCPO's sqrt rule: 0.960255.
    assert staleness.ess(seq[:2]) == pytest.approx(0.922090, rel=1e-5)
    assert staleness.vcpo_lr_scale(seq[:2]) == pytest.approx(0.960255, rel=1e-5)


@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 8),
    bad=st.sampled_from([-math.inf, math.inf, math.nan]),
    in_old=st.booleans(),
)
@SETTINGS
def test_a_non_finite_token_counts_as_no_token(seed: int, n: int, bad: float, in_old: bool) -> None:
    """Making one masked token non-finite (in either log-prob) gives every sequence the ratio it
    has without that token: no other sequence changes, nothing becomes nan, nor do ESS or VCPO."""
    g = torch.Generator().manual_seed(seed)
    old = -5 * torch.rand(3, n, generator=g, dtype=torch.float64)
    beh = -5 * torch.rand(3, n, generator=g, dtype=torch.float64)
    mask = torch.rand(3, n, generator=g) < 0.7
    row, col = int(torch.randint(3, (), generator=g)), int(torch.randint(n, (), generator=g))
    mask[row, col] = True
    without = mask.clone()
    without[row, col] = False
    ref = staleness.seq_log_ratio(old, beh, without)
    (old if in_old else beh)[row, col] = bad
    seq = staleness.seq_log_ratio(old, beh, mask)
    assert seq.isfinite().all()
    torch.testing.assert_close(seq, ref)
    assert staleness.ess(seq) == pytest.approx(staleness.ess(ref), rel=1e-9)
    assert staleness.vcpo_lr_scale(seq) == pytest.approx(staleness.vcpo_lr_scale(ref), rel=1e-9)


def test_vcpo_lr_scale_golden() -> None:
    # Sequence weights [1, 3]: ess 0.8; sqrt rule 0.894427, linear 0.8; rho_ref 0.5 caps at 1.
    lr = torch.tensor([0.0, math.log(3)])
    assert staleness.vcpo_lr_scale(lr) == pytest.approx(math.sqrt(0.8))
    assert staleness.vcpo_lr_scale(lr, rule="linear") == pytest.approx(0.8)
    assert staleness.vcpo_lr_scale(lr, rho_ref=0.5) == 1.0
    assert staleness.vcpo_lr_scale(torch.zeros(5)) == 1.0  # on-policy: full step


def test_vcpo_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="sqrt, linear"):
        staleness.vcpo_lr_scale(torch.zeros(2), rule="cube")
    with pytest.raises(ValueError, match="rho_ref"):
        staleness.vcpo_lr_scale(torch.zeros(2), rho_ref=0.0)


def test_lag_stats_golden() -> None:
    # Trainer at version 5. Row 0 tokens from versions [5, 4, 2]; row 1 [3, 3, pad].
    # Lags: [0, 1, 3] and [2, 2]: mean 8/5 = 1.6, max 3, per-sequence max [3, 2] -> 2.5.
    versions = torch.tensor([[5, 4, 2], [3, 3, -1]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    stats = staleness.lag_stats(versions, mask, trainer_version=5)
    assert stats == {
        "lag_mean": 1.6,
        "lag_max": 3,
        "lag_seq_max_mean": 2.5,
        "lag_hist": [1, 1, 2, 1],
    }
    # With 3 bins the last one holds lag >= 2.
    assert staleness.lag_stats(versions, mask, 5, num_bins=3)["lag_hist"] == [1, 1, 3]
    # More bins than lags: zero-padded.
    assert staleness.lag_stats(versions, mask, 5, num_bins=6)["lag_hist"] == [1, 1, 2, 1, 0, 0]


def test_lag_stats_empty_and_future_tokens() -> None:
    empty = staleness.lag_stats(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2), 3)
    assert empty["lag_max"] == 0 and empty["lag_hist"] == []
    with pytest.raises(ValueError, match="newer than trainer version 3"):
        staleness.lag_stats(torch.tensor([[4]]), torch.tensor([[True]]), 3)
