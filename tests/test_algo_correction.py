"""The rollout correction (algo.correction): golden values by hand for every level and action,
the log-linear proximal policy, and masked tokens leaving the loss and its denominators."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.algo import correction, losses
from slipstream.algo.correction import CorrectionSpec

F64 = torch.float64
L3, LH = math.log(3.0), math.log(0.5)


def _k3(w: float) -> float:
    return w - 1 - math.log(w)


def _apply(drift: list[list[float]], spec: CorrectionSpec, valid=None) -> correction.Correction:
    """behaviour log-probs 0, proximal log-probs = `drift`: the raw weights are exp(drift)."""
    old = torch.tensor(drift, dtype=F64)
    valid = torch.ones_like(old, dtype=torch.bool) if valid is None else valid
    return correction.apply(old, torch.zeros_like(old), valid, spec)


def test_token_truncate_golden() -> None:
    # raw weights 3, 0.5, 1 -> truncated at 2: 2, 0.5, 1; nothing masked.
    c = _apply([[L3, LH, 0.0]], CorrectionSpec())
    torch.testing.assert_close(c.weight, torch.tensor([[2.0, 0.5, 1.0]], dtype=F64))
    m = {k: float(v) for k, v in c.metrics.items()}
    assert m["correction/masked_frac"] == 0.0
    assert m["correction/weight_mean"] == pytest.approx(3.5 / 3)
    assert m["correction/weight_max"] == pytest.approx(2.0)
    # k3 of the *raw* weights, the sampler's mismatch: (0.9014 + 0.1931 + 0) / 3
    assert m["mismatch/kl"] == pytest.approx((_k3(3.0) + _k3(0.5)) / 3)


def test_token_mask_golden() -> None:
    # bounds [1/2, 2]: weight 3 is masked, 0.5 (on the bound) and 1 kept with their weights.
    c = _apply([[L3, LH, 0.0]], CorrectionSpec(action="mask"))
    assert c.keep.tolist() == [[False, True, True]]
    torch.testing.assert_close(c.weight, torch.tensor([[0.0, 0.5, 1.0]], dtype=F64))
    assert float(c.metrics["correction/masked_frac"]) == pytest.approx(1 / 3)
    assert float(c.metrics["correction/weight_mean"]) == pytest.approx(0.75)
    # a lower bound above 0.5 masks that token too
    c = _apply([[L3, LH, 0.0]], CorrectionSpec(action="mask", low=0.6))
    assert c.keep.tolist() == [[False, False, True]]


def test_sequence_and_geometric_levels_golden() -> None:
    # row 0: 3 * 0.5 * 1 = 1.5 (sequence), 1.5^(1/3) = 1.1447 (geometric);
    # row 1: 3 * 3 = 9 -> truncated to 2 (sequence), 3 -> 2 (geometric).
    drift = [[L3, LH, 0.0], [L3, L3, 0.0]]
    valid = torch.tensor([[True, True, True], [True, True, False]])
    seq = _apply(drift, CorrectionSpec(level="sequence"), valid)
    geo = _apply(drift, CorrectionSpec(level="geometric"), valid)
    torch.testing.assert_close(seq.weight, torch.tensor([[1.5] * 3, [2.0, 2.0, 0.0]], dtype=F64))
    g = 1.5 ** (1 / 3)
    torch.testing.assert_close(geo.weight, torch.tensor([[g] * 3, [2.0, 2.0, 0.0]], dtype=F64))
    # at the sequence levels `mask` drops whole sequences: row 1 (weight 9 or 3) leaves
    masked = _apply(drift, CorrectionSpec(level="sequence", action="mask"), valid)
    assert masked.keep.tolist() == [[True, True, True], [False, False, False]]
    assert float(masked.metrics["correction/masked_frac"]) == pytest.approx(2 / 5)


def test_loglinear_proximal_golden() -> None:
    # behaviour -2, current -1: lag 0 -> -2 (the sampler), lag 1 -> -2 + 1/2 = -1.5,
    # lag 3 -> -2 + 3/4 = -1.25; outside the mask the behaviour log-prob is returned.
    beh = torch.full((1, 4), -2.0, dtype=F64)
    cur = torch.full((1, 4), -1.0, dtype=F64, requires_grad=True)
    lag = torch.tensor([[0, 1, 3, 5]])
    valid = torch.tensor([[True, True, True, False]])
    prox = correction.loglinear_proximal(beh, cur, lag, valid)
    torch.testing.assert_close(prox, torch.tensor([[-2.0, -1.5, -1.25, -2.0]], dtype=F64))
    assert not prox.requires_grad


def test_masked_tokens_leave_the_loss_and_its_denominator() -> None:
    # reinforce, token-mean, adv 1, logp -1 on both tokens; proximal = logp; behaviour makes
    # the weights 3 (masked) and 1: the loss is the kept token's -1 * 1 * -1 = 1 over 1 token
    # (not over 2), and the masked token gets no gradient.
    logp = torch.tensor([[-1.0, -1.0]], dtype=F64, requires_grad=True)
    beh = logp.detach() - torch.tensor([[L3, 0.0]], dtype=F64)
    out = losses.compute(
        "reinforce",
        logp,
        beh,
        torch.ones(1, dtype=F64),
        torch.ones(1, 2, dtype=torch.bool),
        old_logp=logp.detach(),
        correction_spec=CorrectionSpec(action="mask"),
    )
    assert out.loss.item() == pytest.approx(1.0)
    assert float(out.metrics["tokens"]) == 1.0 and float(out.metrics["valid_tokens"]) == 2.0
    out.loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1.0]], dtype=F64))


def test_without_a_proximal_policy_the_weight_is_one() -> None:
    logp = torch.tensor([[-1.0, -2.0]], dtype=F64)
    out = losses.compute(
        "ppo", logp, logp - 1.0, torch.ones(1, dtype=F64), torch.ones(1, 2, dtype=torch.bool)
    )
    m = losses.to_floats(out.metrics)
    assert m["correction/weight_mean"] == 1.0 and m["mismatch/kl"] == 0.0
    assert m["correction/masked_frac"] == 0.0


def test_bad_specs_are_rejected() -> None:
    for kw in ({"level": "row"}, {"action": "clip"}, {"high": 0.9}, {"low": 1.5}):
        with pytest.raises(ValueError, match="correction"):
            CorrectionSpec(**kw)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-5, 5), min_size=1, max_size=6),
    st.sampled_from(correction.LEVELS),
    st.sampled_from(correction.ACTIONS),
    st.floats(1.0, 10.0),
)
def test_weights_stay_within_bounds(drift, level, action, high) -> None:
    spec = CorrectionSpec(level, action, None, high)
    c = _apply([drift], spec)
    w = c.weight[c.keep]
    assert bool((w <= high * (1 + 1e-12)).all())
    if action == "mask":
        assert bool((w >= spec.lower * (1 - 1e-12)).all())
    assert 0.0 <= float(c.metrics["correction/masked_frac"]) <= 1.0
    assert float(c.metrics["mismatch/kl"]) >= 0.0


@pytest.mark.parametrize("method", ["dro", "oapl", "reinforce"])
def test_weight_mean_merges_over_kept_tokens_for_every_loss(method) -> None:
    # two micro-batches, proximal = logp, mask at [1/2, 2]: raw weights (3, 1) keep one token
    # of weight 1; (1, 0.5) keep both. Over the 3 kept tokens the mean is (1 + 1 + 0.5) / 3;
    # weighting by valid tokens (dro, oapl keep all 4 in the loss) would give 0.875.
    logp = torch.full((1, 2), -1.0, dtype=F64)
    parts = [
        losses.compute(
            method,
            logp,
            logp - torch.tensor([drift], dtype=F64),
            torch.ones(1, dtype=F64),
            torch.ones(1, 2, dtype=torch.bool),
            old_logp=logp,
            correction_spec=CorrectionSpec(action="mask"),
        ).metrics
        for drift in ([L3, 0.0], [0.0, LH])
    ]
    merged = losses.to_floats(losses.merge_metrics(parts))
    assert merged["correction/weight_mean"] == pytest.approx(2.5 / 3)
    assert merged["kept_tokens"] == 3.0 and merged["valid_tokens"] == 4.0


@pytest.mark.parametrize("method", ["dro", "oapl", "ppo"])
def test_masked_frac_is_what_the_mask_rejects_and_only_weighted_losses_drop_it(method) -> None:
    # proximal = logp, mask at [1/2, 2]: the first token's weight 3 is rejected. Every loss
    # reports it (masked_frac 1/2); ppo drops it from the loss, dro and oapl keep both tokens.
    logp = torch.full((1, 2), -1.0, dtype=F64)
    out = losses.compute(
        method,
        logp,
        logp - torch.tensor([[L3, 0.0]], dtype=F64),
        torch.ones(1, dtype=F64),
        torch.ones(1, 2, dtype=torch.bool),
        old_logp=logp,
        correction_spec=CorrectionSpec(action="mask"),
    )
    m = losses.to_floats(out.metrics)
    assert m["correction/masked_frac"] == pytest.approx(0.5)
    assert m["tokens"] == (2.0 if method in ("dro", "oapl") else 1.0)
