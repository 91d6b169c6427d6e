"""Advantages: hand-derived golden values for every method, and group properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.algo import advantages

SETTINGS = settings(max_examples=60, deadline=None)


def _close(actual: torch.Tensor, expected: list[list[float]], tol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected), atol=tol, rtol=0)


def test_grpo_golden() -> None:
    # R = [1, 0, 0, 1]: mean 0.5, deviations ±0.5, sum of squares 1, std (ddof=1) = sqrt(1/3).
    # A = ±0.5 / (sqrt(1/3) + 1e-6) = ±0.866024.
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    _close(advantages.compute(torch.tensor([[1.0, 0, 0, 1]]), "grpo"), [[a, -a, -a, a]])


def test_grpo_single_sample_is_zero() -> None:
    _close(advantages.compute(torch.tensor([[1.0], [0.0]]), "grpo"), [[0.0], [0.0]])


def test_dr_grpo_golden() -> None:
    # R - mean: [1, 0, 0, 0] has mean 0.25.
    _close(
        advantages.compute(torch.tensor([[1.0, 0, 0, 0]]), "dr_grpo"), [[0.75, -0.25, -0.25, -0.25]]
    )


def test_rloo_golden() -> None:
    # R_0 = 1, others [0, 0, 1] average 1/3, so A_0 = 2/3; R_1 = 0, others [1, 0, 1] -> -2/3.
    # Same as G/(G-1) (R - mean) = 4/3 * ±0.5.
    _close(
        advantages.compute(torch.tensor([[1.0, 0, 0, 1]]), "rloo"), [[2 / 3, -2 / 3, -2 / 3, 2 / 3]]
    )


def test_rloo_needs_two_samples() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        advantages.compute(torch.tensor([[1.0]]), "rloo")


def test_maxrl_golden() -> None:
    # [1, 0, 0, 0]: p = 0.25, A = (R - 0.25) / 0.25 = [3, -1, -1, -1] (eps 1e-6 ignored at 1e-5).
    # [1, -1]: mean 0, so 0 by definition (not a division by eps).
    out = advantages.compute(torch.tensor([[1.0, 0, 0, 0], [1.0, -1.0, 1.0, -1.0]]), "maxrl")
    _close(out, [[3.0, -1.0, -1.0, -1.0], [0.0, 0.0, 0.0, 0.0]], tol=1e-4)


def test_maxrl_gives_a_group_with_a_negative_mean_zero() -> None:
    # [1, -1, -1]: mean -1/3 <= 0; the formula would give (R + 1/3) / (-1/3) = [-4, 2, 2],
    # rewarding the failures. maxrl is defined for rewards in [0, 1]: the group gets 0.
    # [0.5, 1.0] is unaffected: mean 0.75, A = [-1/3, 1/3].
    out = advantages.compute(torch.tensor([[1.0, -1.0, -1.0], [0.5, 1.0, 0.75]]), "maxrl")
    _close(out, [[0.0, 0.0, 0.0], [-1 / 3, 1 / 3, 0.0]], tol=1e-4)


def test_oapl_golden() -> None:
    # beta = 1, R = [1, 0]: V = log((e + 1) / 2) = 0.620115; A = [0.379885, -0.620115].
    v = math.log((math.e + 1) / 2)
    _close(advantages.compute(torch.tensor([[1.0, 0.0]]), "oapl"), [[1 - v, -v]])
    # beta = 0.5: V = 0.5 log((e^2 + 1) / 2) = 0.716890, closer to the max as beta shrinks.
    v = 0.5 * math.log((math.e**2 + 1) / 2)
    _close(advantages.compute(torch.tensor([[1.0, 0.0]]), "oapl", beta=0.5), [[1 - v, -v]])


def test_oapl_large_rewards_do_not_overflow() -> None:
    out = advantages.compute(torch.tensor([[1000.0, 0.0]]), "oapl", beta=0.01)
    assert torch.isfinite(out).all()
    # V ~= max + beta log(1/2): the winner's advantage is 0.01 log 2.
    assert out[0, 0].item() == pytest.approx(0.01 * math.log(2), abs=1e-4)


@pytest.mark.parametrize("method", list(advantages.METHODS))
@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, -3.7, 1e6])
def test_equal_rewards_give_exact_zero(method: str, value: float) -> None:
    rewards = torch.full((3, 7), value)
    out = advantages.compute(rewards, method)
    assert torch.equal(out, torch.zeros_like(out))


@given(
    n=st.integers(1, 4),
    g=st.integers(2, 8),
    seed=st.integers(0, 2**31 - 1),
    binary=st.booleans(),
)
@SETTINGS
def test_group_advantages_sum_to_zero(n: int, g: int, seed: int, binary: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.rand(n, g, generator=gen, dtype=torch.float64)
    rewards = (rewards > 0.5).double() if binary else rewards
    for method in ("grpo", "dr_grpo", "rloo", "maxrl"):
        sums = advantages.compute(rewards, method).sum(dim=1)
        torch.testing.assert_close(sums, torch.zeros(n, dtype=torch.float64), atol=1e-6, rtol=0)


@given(g=st.integers(2, 8), seed=st.integers(0, 2**31 - 1), shift=st.floats(-10, 10))
@SETTINGS
def test_oapl_is_shift_invariant_and_bounded(g: int, seed: int, shift: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.rand(2, g, generator=gen, dtype=torch.float64)
    a = advantages.compute(rewards, "oapl")
    torch.testing.assert_close(advantages.compute(rewards + shift, "oapl"), a)
    # mean R <= V <= max R (soft-max lies between mean and max).
    assert (a.amax(dim=1) >= -1e-12).all()
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    assert (a <= centred + 1e-12).all()


def test_result_is_detached_and_float() -> None:
    rewards = torch.tensor([[1.0, 0.0, 1.0]], requires_grad=True)
    for method in advantages.METHODS:
        assert not advantages.compute(rewards, method).requires_grad
    assert advantages.compute(torch.tensor([[1, 0]]), "grpo").dtype == torch.float32


def test_unknown_method_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"grpo, dr_grpo, rloo, maxrl, oapl"):
        advantages.compute(torch.zeros(1, 2), "ppo")


def test_unknown_setting_and_bad_shape_are_rejected() -> None:
    with pytest.raises(ValueError, match="beta"):
        advantages.compute(torch.zeros(1, 2), "dr_grpo", beta=1.0)
    with pytest.raises(ValueError, match=r"\[N, G\]"):
        advantages.compute(torch.zeros(4), "grpo")
