"""Losses: golden values derived by hand for every method and agg, and the decoupled correction.

Convention in the goldens: `behavior_logp = 0` and `logp = log r`, so the ratio is `r` exactly.
Properties, gradient identities and the naive reference live in test_algo_losses_props.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from slipstream.algo import losses
from slipstream.algo.correction import CorrectionSpec

F64 = torch.float64


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def _leaf(rows: list[list[float]]) -> torch.Tensor:
    return _t(rows).requires_grad_()


def _ones(b: int, t: int) -> torch.Tensor:
    return torch.ones(b, t, dtype=torch.bool)


def _run(method: str, logp: torch.Tensor, beh: torch.Tensor, adv: list[float], mask=None, **kw):
    mask = _ones(*logp.shape) if mask is None else mask
    out = losses.compute(method, logp, beh, torch.tensor(adv, dtype=F64), mask, **kw)
    out.loss.backward()
    return out


def test_reinforce_golden() -> None:
    # r = 1, adv = 2: per-token -2 * logp = [2, 4]; token-mean 3; d/dlogp = -2 / 2 = -1.
    logp = _leaf([[-1.0, -2.0]])
    out = _run("reinforce", logp, logp.detach().clone(), [2.0])
    assert out.loss.item() == pytest.approx(3.0)
    torch.testing.assert_close(logp.grad, _t([[-1.0, -1.0]]))


def test_reinforce_cap_truncates_the_weight() -> None:
    # behavior = logp - log 3 -> r = 3, cap 2: per-token -2 * 1 * logp = [2, 4] -> mean 3,
    # gradient -2 * 1 / 2 = -1 per token; both tokens count as clipped.
    logp = _leaf([[-1.0, -2.0]])
    out = _run("reinforce", logp, logp.detach() - math.log(3), [1.0], cap=2.0)
    assert out.loss.item() == pytest.approx(3.0)
    torch.testing.assert_close(logp.grad, _t([[-1.0, -1.0]]))
    assert out.metrics["clip_frac"].item() == 1.0
    assert out.metrics["ratio_max"].item() == pytest.approx(3.0)


# PPO rows (r, adv) with eps 0.2, per-token loss max(-adv r, -adv clip(r, 0.8, 1.2)) and its
# gradient in logp (d r / d logp = r, zero where the clipped branch wins):
#   (1.5, +1): max(-1.5, -1.2) = -1.2  clipped, grad 0
#   (0.5, +1): max(-0.5, -0.8) = -0.5  grad -adv r = -0.5
#   (0.5, -1): max( 0.5,  0.8) =  0.8  clipped, grad 0
#   (1.5, -1): max( 1.5,  1.2) =  1.5  grad -adv r = 1.5
PPO_R = [1.5, 0.5, 0.5, 1.5]
PPO_ADV = [1.0, 1.0, -1.0, -1.0]


def test_ppo_golden_outside_clip_range() -> None:
    logp = _leaf([[math.log(r)] for r in PPO_R])
    out = _run("ppo", logp, torch.zeros(4, 1, dtype=F64), PPO_ADV)
    assert out.loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 1.5) / 4)
    torch.testing.assert_close(logp.grad, _t([[0.0], [-0.5 / 4], [0.0], [1.5 / 4]]))
    assert out.metrics["clip_frac"].item() == pytest.approx(0.5)
    assert out.metrics["ratio_mean"].item() == pytest.approx(1.0)
    assert out.metrics["ratio_max"].item() == pytest.approx(1.5)


def test_ppo_dual_clip_golden() -> None:
    # adv = -1, c = 3: r = 4 gives max(4, 1.2) = 4, then min(4, 3) = 3 with no gradient;
    # r = 2 gives 2 < 3, unchanged, gradient -adv r = 2.
    logp = _leaf([[math.log(4.0)], [math.log(2.0)]])
    out = _run("ppo", logp, torch.zeros(2, 1, dtype=F64), [-1.0, -1.0], dual_clip=3.0)
    assert out.loss.item() == pytest.approx((3.0 + 2.0) / 2)
    torch.testing.assert_close(logp.grad, _t([[0.0], [1.0]]))
    assert out.metrics["clip_frac"].item() == pytest.approx(0.5)


def test_dapo_is_ppo_with_clip_higher() -> None:
    # r = 1.25, adv = 1: ppo clips at 1.2 (loss -1.2); dapo's 1.28 does not (loss -1.25).
    # r = 1.3: dapo clips at 1.28.
    beh = torch.zeros(2, 1, dtype=F64)
    logp = _t([[math.log(1.25)], [math.log(1.3)]])
    ppo = losses.compute("ppo", logp, beh, _t([[1.0], [1.0]])[:, 0], _ones(2, 1))
    dapo = losses.compute("dapo", logp, beh, _t([[1.0], [1.0]])[:, 0], _ones(2, 1))
    assert ppo.loss.item() == pytest.approx((-1.2 - 1.2) / 2)
    assert dapo.loss.item() == pytest.approx((-1.25 - 1.28) / 2)
    assert losses.METHODS["dapo"].fn is losses.METHODS["ppo"].fn
    assert dict(losses.METHODS["dapo"].defaults) == {
        **losses.METHODS["ppo"].defaults,
        "eps_high": 0.28,
    }


def test_cispo_golden() -> None:
    # r = 6, adv = 1: coefficient clip(6, 0, 5) = 5, loss -5 log 6, grad -5 (never zeroed).
    # r = 0.5, adv = -1: coefficient 0.5, loss -0.5 * -1 * log 0.5, grad +0.5.
    logp = _leaf([[math.log(6.0)], [math.log(0.5)]])
    out = _run("cispo", logp, torch.zeros(2, 1, dtype=F64), [1.0, -1.0])
    assert out.loss.item() == pytest.approx((-5 * math.log(6) + 0.5 * math.log(0.5)) / 2)
    torch.testing.assert_close(logp.grad, _t([[-5.0 / 2], [0.5 / 2]]))
    assert out.metrics["clip_frac"].item() == pytest.approx(0.5)


def test_dro_golden() -> None:
    # logp = -1, behavior = -1.5, adv = 2, beta = 0.05:
    # loss = -(2 * -1 - 0.025 * 0.5^2) = 2.00625; grad = -(adv - beta (logp - beh)) = -1.975.
    logp = _leaf([[-1.0]])
    out = _run("dro", logp, _t([[-1.5]]), [2.0])
    assert out.loss.item() == pytest.approx(2.00625)
    torch.testing.assert_close(logp.grad, _t([[-1.975]]))


def test_gspo_golden_sequence_ratio() -> None:
    # Row 0: log-ratios [0.1, 0.3] -> s = exp(0.2) = 1.2214 > 1.0004, adv 1: loss -1.0004, no grad.
    # Row 1: log-ratios [-1e-4, -1e-4, (masked 5.0)] -> s = exp(-1e-4) inside [0.9997, 1.0004],
    # adv 2: loss -2 s; d/dlogp_t = -2 s / 2 tokens. seq-mean over 2 rows halves both.
    logp = _leaf([[0.1, 0.3, 0.0], [-1e-4, -1e-4, 5.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    out = _run("gspo", logp, torch.zeros(2, 3, dtype=F64), [1.0, 2.0], mask)
    s = math.exp(-1e-4)
    assert out.loss.item() == pytest.approx((-1.0004 - 2 * s) / 2)
    torch.testing.assert_close(logp.grad, _t([[0.0, 0.0, 0.0], [-s / 2, -s / 2, 0.0]]))
    assert out.metrics["clip_frac"].item() == pytest.approx(0.5)  # 2 of 4 tokens


def test_oapl_golden_regression() -> None:
    # Row 0: sum(logp - beh) = 0.2 + 0.3 = 0.5, adv 0.3: (0.5 - 0.3)^2 = 0.04, d/dlogp = 2 * 0.2.
    # Row 1: sum = -0.1, adv -0.2: (-0.1 + 0.2)^2 = 0.01, d/dlogp = 2 * 0.1.
    # seq-mean: loss 0.025, gradients halved.
    beh = _t([[-1.0, -1.0], [-2.0, -2.0]])
    logp = (beh + _t([[0.2, 0.3], [-0.1, 0.0]])).requires_grad_()
    out = _run("oapl", logp, beh, [0.3, -0.2])
    assert out.loss.item() == pytest.approx(0.025)
    torch.testing.assert_close(logp.grad, _t([[0.2, 0.2], [0.1, 0.1]]))


# Aggregation goldens: per-token loss l = -logp (reinforce, r = 1, adv = 1).
# Row 0: l = [1, 2, 3]; row 1: l = [4] then two padding tokens.
AGG_LOGP = [[-1.0, -2.0, -3.0], [-4.0, -9.0, -9.0]]
AGG_MASK = torch.tensor([[True, True, True], [True, False, False]])


@pytest.mark.parametrize(
    ("agg", "kw", "expected"),
    [
        ("token-mean", {}, (1 + 2 + 3 + 4) / 4),  # 2.5
        ("token-mean", {"num_tokens": 8}, 10 / 8),  # step-wide token count
        ("seq-mean-token-mean", {}, (6 / 3 + 4 / 1) / 2),  # 3.0
        ("seq-mean-token-mean", {"num_seqs": 4}, (2 + 4) / 4),
        ("seq-mean-token-sum", {}, (6 + 4) / 2),  # 5.0
        ("token-sum-norm", {"max_len": 4}, 10 / (2 * 4)),  # 1.25
        ("token-sum-norm", {"max_len": 4, "num_seqs": 5}, 10 / (5 * 4)),
    ],
)
def test_aggregation_golden(agg: str, kw: dict, expected: float) -> None:
    logp = _t(AGG_LOGP)
    out = losses.compute("reinforce", logp, logp, _t([[1.0, 1.0]])[0], AGG_MASK, agg=agg, **kw)
    assert out.loss.item() == pytest.approx(expected)


def test_decoupled_weight_is_capped_and_detached() -> None:
    # old = logp (r = 1); behavior = old - log 3 -> w = 3, capped at 2 by default.
    # per-token -w * adv * logp with adv 1, logp -1: 2 (capped) or 3 (cap raised to 10).
    logp = _leaf([[-1.0]])
    beh = logp.detach() - math.log(3)
    adv = torch.tensor([1.0], dtype=F64)
    capped = losses.compute("reinforce", logp, beh, adv, _ones(1, 1), old_logp=logp.detach())
    free = losses.compute(
        "reinforce",
        logp,
        beh,
        adv,
        _ones(1, 1),
        old_logp=logp.detach(),
        correction_spec=CorrectionSpec(high=10.0),
    )
    assert capped.loss.item() == pytest.approx(2.0)
    assert free.loss.item() == pytest.approx(3.0)
    assert capped.metrics["correction/weight_mean"].item() == pytest.approx(2.0)
    capped.loss.backward()
    torch.testing.assert_close(logp.grad, _t([[-2.0]]))


def test_decoupled_ppo_clips_against_old_not_behavior() -> None:
    # behavior is far away (log-ratio 1.5) but logp == old: r = 1, nothing clipped,
    # per-token loss -w * adv * r with w = min(e^1.5, 2) = 2.
    logp = _leaf([[-1.0, -2.0]])
    beh = logp.detach() - 1.5
    out = _run("ppo", logp, beh, [1.0], old_logp=logp.detach().clone())
    assert out.metrics["clip_frac"].item() == 0.0
    assert out.metrics["ratio_mean"].item() == pytest.approx(1.0)
    assert out.loss.item() == pytest.approx(-2.0)
    # approx_kl is against behavior: r_b = e^1.5, k3 = e^1.5 - 1 - 1.5.
    assert out.metrics["approx_kl"].item() == pytest.approx(math.exp(1.5) - 2.5)


def test_gspo_takes_the_correction_level() -> None:
    # old - beh = [log 1.2, log 1.8], r = 1 so the per-token loss is -w * adv.
    # geometric: one weight exp(mean) = sqrt(1.2 * 1.8) = 1.4697 -> loss -1.4697;
    # token (the default): weights 1.2 and 1.8, seq-mean-token-mean -> -(1.2 + 1.8) / 2 = -1.5.
    logp = _t([[-1.0, -1.0]])
    beh = logp - _t([[math.log(1.2), math.log(1.8)]])
    args = ("gspo", logp, beh, _t([[1.0]])[0], _ones(1, 2))
    geo = losses.compute(*args, old_logp=logp, correction_spec=CorrectionSpec(level="geometric"))
    assert geo.loss.item() == pytest.approx(-math.sqrt(1.2 * 1.8))
    assert losses.compute(*args, old_logp=logp).loss.item() == pytest.approx(-1.5)


@pytest.mark.parametrize("method", ["dro", "oapl"])
def test_dro_and_oapl_ignore_the_behavior_weight(method: str) -> None:
    logp = _t([[-1.0, -2.0]])
    beh = logp - 0.7
    adv = _t([[0.5]])[0]
    plain = losses.compute(method, logp, beh, adv, _ones(1, 2))
    decoupled = losses.compute(method, logp, beh, adv, _ones(1, 2), old_logp=logp - 0.3)
    assert decoupled.loss.item() == pytest.approx(plain.loss.item())


def test_metrics_golden_and_detached() -> None:
    # r = 2 on both tokens: ratio_mean 2, approx_kl = 2 - 1 - log 2 = 0.306853.
    logp = _leaf([[math.log(2.0), math.log(2.0)]])
    out = _run("reinforce", logp, torch.zeros(1, 2, dtype=F64), [1.0])
    m = losses.to_floats(out.metrics)
    assert m["ratio_mean"] == pytest.approx(2.0)
    assert m["approx_kl"] == pytest.approx(1 - math.log(2))
    assert m["nonfinite_tokens"] == 0.0 and m["tokens"] == 2.0
    assert set(losses.METRIC_REDUCTIONS) == set(out.metrics)
    assert all(not v.requires_grad for v in out.metrics.values())


def test_log_ratio_is_clamped() -> None:
    logp = _t([[0.0]])
    out = losses.compute("ppo", logp, _t([[-500.0]]), _t([[-1.0]])[0], _ones(1, 1))
    assert math.isfinite(out.loss.item())
    assert out.metrics["ratio_max"].item() == pytest.approx(math.exp(20))


def test_unknown_names_list_valid_ones() -> None:
    args = (_t([[0.0]]), _t([[0.0]]), _t([[1.0]])[0], _ones(1, 1))
    with pytest.raises(ValueError, match="reinforce, ppo, dapo, cispo, dro, gspo, oapl"):
        losses.compute("trpo", *args)
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean"):
        losses.compute("ppo", *args, agg="seq-sum")
    with pytest.raises(ValueError, match="eps_low"):
        losses.compute("ppo", *args, epsilon=0.1)
    with pytest.raises(ValueError, match="max_len"):
        losses.compute("ppo", *args, agg="token-sum-norm")
    with pytest.raises(ValueError, match="dual_clip"):
        losses.compute("ppo", *args, dual_clip=0.5)


def test_bad_inputs_are_rejected() -> None:
    logp, mask = _t([[0.0, 0.0]]), _ones(1, 2)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        losses.compute("ppo", logp, _t([[0.0]]), _t([[1.0]])[0], mask)
    with pytest.raises(ValueError, match="adv"):
        losses.compute("ppo", logp, logp, _t([[1.0, 1.0]])[0], mask)
    with pytest.raises(ValueError, match="low <= 1 <= high"):
        CorrectionSpec(high=0.5)


def test_low_precision_logp_is_computed_in_float32() -> None:
    # bf16 rounds a count of 301 to 300; the loss math runs in float32, which counts exactly.
    logp = torch.zeros(1, 301, dtype=torch.bfloat16, requires_grad=True)
    out = losses.compute("ppo", logp, logp.detach(), torch.ones(1), _ones(1, 301))
    assert out.metrics["tokens"].item() == 301.0
    assert out.loss.dtype == torch.float32
    out.loss.backward()
    assert logp.grad.dtype == torch.bfloat16


def test_approx_kl_is_accurate_near_on_policy_in_float32() -> None:
    # k3 = exp(x) - 1 - x ~ x^2 / 2: 4.5e-10 at x = 3e-5, 5e-9 at x = -1e-4. Written that way
    # in float32 it cancels to 6e-8 (130x) and 0; expm1(x) - x keeps it to a fraction of 1 %.
    beh = torch.full((1, 2), -1.0)
    logp = beh + torch.tensor([[3e-5, -1e-4]])
    x = (logp - beh).double()  # the log-ratios as float32 holds them
    want = float((x.exp() - 1 - x).mean())
    out = losses.compute("ppo", logp, beh, torch.ones(1), _ones(1, 2))
    assert out.metrics["approx_kl"].item() == pytest.approx(want, rel=1e-2)
