"""Loss properties: micro-batch and padding invariance for every method and agg, masked tokens,
non-finite tokens, on-policy identities, CISPO's gradient, and a naive loop-based reference."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.algo import losses

F64 = torch.float64
SETTINGS = settings(max_examples=25, deadline=None)
# Each example of these runs every method under every agg.
HEAVY = settings(max_examples=10, deadline=None)
SEEDS = st.integers(0, 2**31 - 1)


def _random(seed: int, b: int, t: int, *, drift: float = 0.3, with_old: bool = True):
    """Inputs `[b, t]` with every row holding at least one masked token."""
    g = torch.Generator().manual_seed(seed)
    logp = -3 * torch.rand(b, t, generator=g, dtype=F64)
    beh = logp + drift * torch.randn(b, t, generator=g, dtype=F64)
    old = logp + 0.2 * torch.randn(b, t, generator=g, dtype=F64) if with_old else None
    adv = torch.randn(b, generator=g, dtype=F64)
    mask = torch.rand(b, t, generator=g) < 0.7
    mask[:, 0] = True
    return logp, beh, old, adv, mask


def _loss_and_grad(method, logp, beh, adv, mask, agg, **kw):
    leaf = logp.clone().requires_grad_()
    out = losses.compute(method, leaf, beh, adv, mask, agg=agg, max_len=8, **kw)
    out.loss.backward()
    return out.loss.detach(), leaf.grad


@given(seed=SEEDS, b=st.integers(2, 5), t=st.integers(1, 6), with_old=st.booleans())
@HEAVY
def test_micro_batch_split_keeps_loss_and_gradient(seed, b, t, with_old) -> None:
    logp, beh, old, adv, mask = _random(seed, b, t, with_old=with_old)
    step = {"num_tokens": mask.sum(), "num_seqs": int(mask.any(1).sum())}
    cut = 1 + seed % (b - 1)
    for method in losses.METHODS:
        for agg in losses.AGGS:
            full_loss, full_grad = _loss_and_grad(method, logp, beh, adv, mask, agg, old_logp=old)
            leaf = logp.clone().requires_grad_()
            total = torch.zeros((), dtype=F64)
            for rows in (slice(0, cut), slice(cut, b)):
                # Trim columns to the micro-batch's longest sequence, as Batch.slice does.
                width = int(mask[rows].nonzero()[:, 1].max()) + 1
                cols = (rows, slice(0, width))
                out = losses.compute(
                    method, leaf[cols], beh[cols], adv[rows], mask[cols], agg=agg,
                    old_logp=None if old is None else old[cols], max_len=8, **step,
                )  # fmt: skip
                out.loss.backward()
                total = total + out.loss.detach()
            torch.testing.assert_close(total, full_loss, msg=f"{method} {agg}")
            torch.testing.assert_close(leaf.grad, full_grad, msg=f"{method} {agg}")


@given(seed=SEEDS, b=st.integers(1, 4), t=st.integers(1, 5), pad=st.integers(1, 3))
@HEAVY
def test_padding_changes_nothing_and_masked_tokens_get_no_gradient(seed, b, t, pad) -> None:
    logp, beh, old, adv, mask = _random(seed, b, t)
    # Extra columns and one extra row of padding, holding garbage (nan, inf) under mask False.
    junk = torch.full((b + 1, t + pad), math.nan, dtype=F64)
    junk[:, -1] = math.inf

    def padded(x: torch.Tensor) -> torch.Tensor:
        y = junk.clone()
        y[:b, :t] = x
        return y

    pmask = torch.zeros(b + 1, t + pad, dtype=torch.bool)
    pmask[:b, :t] = mask
    padv = torch.cat([adv, torch.tensor([math.nan], dtype=F64)])
    for method in losses.METHODS:
        for agg in losses.AGGS:
            loss, grad = _loss_and_grad(method, logp, beh, adv, mask, agg, old_logp=old)
            ploss, pgrad = _loss_and_grad(
                method, padded(logp), padded(beh), padv, pmask, agg, old_logp=padded(old)
            )
            torch.testing.assert_close(ploss, loss, msg=f"{method} {agg}")
            torch.testing.assert_close(pgrad[:b, :t], grad, msg=f"{method} {agg}")
            assert (pgrad[~pmask] == 0).all() and (grad[~mask] == 0).all()


@given(seed=SEEDS, b=st.integers(1, 4), t=st.integers(2, 5), which=st.integers(0, 5))
@HEAVY
def test_non_finite_token_is_dropped(seed, b, t, which) -> None:
    logp, beh, old, adv, mask = _random(seed, b, t)
    i, j = seed % b, 0  # column 0 is always masked in
    bad = [math.nan, math.inf, -math.inf][which % 3]
    broken = {"logp": logp.clone(), "beh": beh.clone(), "old": old.clone()}
    broken[["logp", "beh", "old"][which // 2 % 3]][i, j] = bad
    dropped = mask.clone()
    dropped[i, j] = False
    for method in losses.METHODS:
        for agg in losses.AGGS:
            want, want_grad = _loss_and_grad(method, logp, beh, adv, dropped, agg, old_logp=old)
            leaf = broken["logp"].clone().requires_grad_()
            out = losses.compute(
                method, leaf, broken["beh"], adv, mask, agg=agg, old_logp=broken["old"], max_len=8
            )
            out.loss.backward()
            assert out.metrics["nonfinite_tokens"].item() == 1.0
            torch.testing.assert_close(out.loss.detach(), want, msg=f"{method} {agg}")
            torch.testing.assert_close(leaf.grad, want_grad, msg=f"{method} {agg}")


@given(seed=SEEDS, b=st.integers(1, 4), t=st.integers(1, 5))
@SETTINGS
def test_on_policy_clipped_equals_unclipped_and_reinforce(seed, b, t) -> None:
    logp, _, _, adv, mask = _random(seed, b, t)
    for agg in losses.AGGS:
        _, grad_reinforce = _loss_and_grad("reinforce", logp, logp, adv, mask, agg)
        _, grad_cispo = _loss_and_grad("cispo", logp, logp, adv, mask, agg)
        torch.testing.assert_close(grad_cispo, grad_reinforce)
        for method in ("ppo", "dapo"):
            loss, grad = _loss_and_grad(method, logp, logp, adv, mask, agg)
            wide, wide_grad = _loss_and_grad(
                method, logp, logp, adv, mask, agg, eps_low=1.0, eps_high=1e9
            )
            torch.testing.assert_close(loss, wide)
            torch.testing.assert_close(grad, wide_grad)
            torch.testing.assert_close(grad, grad_reinforce)
    # GSPO on-policy: d/dlogp_t of -adv * exp(mean_t log r) is -adv / n_i, as REINFORCE with
    # the per-sequence token mean.
    agg = "seq-mean-token-mean"
    _, grad_gspo = _loss_and_grad("gspo", logp, logp, adv, mask, agg)
    torch.testing.assert_close(
        grad_gspo, _loss_and_grad("reinforce", logp, logp, adv, mask, agg)[1]
    )


@given(seed=SEEDS, b=st.integers(1, 4), t=st.integers(1, 6), with_old=st.booleans())
@SETTINGS
def test_cispo_gradient_is_clipped_weight_times_score(seed, b, t, with_old) -> None:
    logp, beh, old, adv, mask = _random(seed, b, t, drift=2.0, with_old=with_old)
    _, grad = _loss_and_grad("cispo", logp, beh, adv, mask, "token-mean", old_logp=old)
    # d loss / d logp = -sg(clip(r, 0, 5)) * w * A / num_tokens on masked tokens.
    prox = beh if old is None else old
    weight = torch.ones_like(logp) if old is None else (old - beh).exp().clamp(max=2.0)
    manual = -(logp - prox).exp().clamp(0.0, 5.0) * weight * adv[:, None] / mask.sum()
    torch.testing.assert_close(grad, torch.where(mask, manual, 0.0))


def _reference_ppo(logp, beh, old, adv, mask, agg, eps_low, eps_high, dual, cap, max_len):
    """One token at a time, with 0-d tensor ops so autograd gives the reference gradient."""
    rows = []
    for i in range(logp.shape[0]):
        row = []
        for t in range(logp.shape[1]):
            if not mask[i, t]:
                continue
            prox = beh[i, t] if old is None else old[i, t]
            r = torch.exp(torch.clamp(logp[i, t] - prox, -20.0, 20.0))
            a = adv[i]
            clipped = torch.clamp(r, 1 - eps_low, 1 + eps_high)
            loss = torch.maximum(-a * r, -a * clipped)
            if dual is not None and a < 0:
                loss = torch.minimum(loss, -a * dual)
            if old is not None:
                loss = loss * min(math.exp(float(old[i, t] - beh[i, t])), cap)
            row.append(loss)
        rows.append(row)
    tokens = sum(len(r) for r in rows)
    seqs = sum(1 for r in rows if r)
    total = sum(sum(r) for r in rows)
    if agg == "token-mean":
        return total / tokens
    if agg == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows if r) / seqs
    if agg == "seq-mean-token-sum":
        return total / seqs
    return total / (seqs * max_len)


@given(
    seed=SEEDS,
    b=st.integers(1, 4),
    t=st.integers(1, 5),
    with_old=st.booleans(),
    dual=st.sampled_from([None, 3.0]),
    eps=st.sampled_from([(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)]),
)
@SETTINGS
def test_ppo_matches_naive_reference(seed, b, t, with_old, dual, eps) -> None:
    logp, beh, old, adv, mask = _random(seed, b, t, drift=0.6, with_old=with_old)
    for agg in losses.AGGS:
        leaf = logp.clone().requires_grad_()
        want = _reference_ppo(leaf, beh, old, adv, mask, agg, *eps, dual, 2.0, 8)
        (want_grad,) = torch.autograd.grad(want, leaf)
        loss, grad = _loss_and_grad(
            "ppo", logp, beh, adv, mask, agg, old_logp=old,
            eps_low=eps[0], eps_high=eps[1], dual_clip=dual,
        )  # fmt: skip
        torch.testing.assert_close(loss, want.detach(), msg=agg)
        torch.testing.assert_close(grad, want_grad, msg=agg)


@given(seed=SEEDS, b=st.integers(2, 5), t=st.integers(1, 6))
@SETTINGS
def test_merged_micro_batch_metrics_equal_full_batch(seed, b, t) -> None:
    logp, beh, old, adv, mask = _random(seed, b, t, drift=0.8)
    full = losses.compute("ppo", logp, beh, adv, mask, old_logp=old).metrics
    cut = 1 + seed % (b - 1)
    parts = [
        losses.compute("ppo", logp[r], beh[r], adv[r], mask[r], old_logp=old[r]).metrics
        for r in (slice(0, cut), slice(cut, b))
    ]
    merged = losses.merge_metrics(parts)
    for name, value in full.items():
        torch.testing.assert_close(merged[name], value, msg=name)
