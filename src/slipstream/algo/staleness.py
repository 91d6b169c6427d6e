"""Measuring and controlling staleness: token lag, effective sample size, VCPO step scale.

The lag of a token is `trainer_version - token_version` when the trainer uses it. Importance
weights `w = exp(log_ratio)` measure how far the data's policy is from the one being trained;
their normalised effective sample size (Kong 1992) `ess = (sum w)^2 / (n * sum w^2)` lies in
(0, 1] and is 1 exactly on-policy. These functions return Python numbers: they feed metrics
and the learning rate, at the edge of the step, not the differentiable loss.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

RULES = ("sqrt", "linear")


def ess(log_ratio: Tensor, mask: Tensor | None = None) -> float:
    """Normalised ESS of `w = exp(log_ratio)` over the entries where `mask` is True.

    `log_ratio` any shape (`[B, T]` token ratios or `[B]` sequence ratios), `mask` the same
    shape. Computed in log space, `2 lse(lr) - lse(2 lr) - log n`, so weights of e^1000 do not
    overflow. Non-finite log-ratios are ignored; with no entry left the result is 1.0.
    """
    lr = log_ratio.detach().double()
    keep = lr.isfinite() if mask is None else mask.bool() & lr.isfinite()
    lr = lr[keep]
    n = lr.numel()
    if n == 0:
        return 1.0
    log_ess = 2 * torch.logsumexp(lr, 0) - torch.logsumexp(2 * lr, 0) - math.log(n)
    # Cauchy-Schwarz bounds ess by 1; rounding can overshoot by an ulp.
    return min(1.0, math.exp(float(log_ess)))


def seq_log_ratio(old_logp: Tensor, behavior_logp: Tensor, mask: Tensor) -> Tensor:
    """Sequence log importance ratio `sum_t mask * (old_logp - behavior_logp)`: `[B, T]` -> `[B]`.

    Tokens outside `mask` (prompt, padding, tool output) contribute nothing, even when their
    values are not finite; nor does a token of `mask` whose difference is not finite. A
    sequence is made of its finite tokens, as in the loss (`losses.finite_tokens`): one bad
    token would otherwise make the whole sequence's ratio inf or nan, and the ESS and VCPO
    drop it, while the loss trains on its other tokens.
    """
    diff = (old_logp - behavior_logp).detach()
    return torch.where(mask.bool() & diff.isfinite(), diff, 0.0).sum(dim=1)


def vcpo_lr_scale(seq_log_ratio: Tensor, rule: str = "sqrt", rho_ref: float = 1.0) -> float:
    """Learning-rate multiplier for one step from the sequence ratios `[B]` of its batch.

    VCPO step-size control: `rho = ess(w_i)` with `w_i = exp(seq_log_ratio_i)`, scale
    `sqrt(min(1, rho / rho_ref))` (`rule="linear"` drops the square root). A batch far from the
    sampler's policy has a high-variance gradient, so the step shrinks with its ESS. The result
    is in (0, 1] and applies to that step only.
    """
    if rule not in RULES:
        raise ValueError(f"unknown vcpo rule {rule!r}; valid: {', '.join(RULES)}")
    if not 0 < rho_ref <= 1:
        raise ValueError(f"rho_ref must be in (0, 1], got {rho_ref}")
    scale = min(1.0, ess(seq_log_ratio) / rho_ref)
    return math.sqrt(scale) if rule == "sqrt" else scale


def lag_stats(
    versions: Tensor, mask: Tensor, trainer_version: int, num_bins: int | None = None
) -> dict[str, float | int | list[int]]:
    """Lag of every masked token of `versions` `[B, T]` against `trainer_version`.

    Returns `lag_mean` (over tokens), `lag_max`, `lag_seq_max_mean` (mean over sequences of the
    oldest token's lag, the quantity a staleness bound acts on) and `lag_hist`: token counts for
    lag 0, 1, ..., with the last bin holding everything at or above `num_bins - 1` when
    `num_bins` is given. A negative lag (a token newer than the trainer) raises `ValueError`.
    """
    mask = mask.bool()
    lag = trainer_version - versions.detach().long()
    token_lag = lag[mask]
    if token_lag.numel() == 0:
        return {"lag_mean": 0.0, "lag_max": 0, "lag_seq_max_mean": 0.0, "lag_hist": []}
    if int(token_lag.min()) < 0:
        raise ValueError(
            f"token version {int(versions[mask].max())} is newer than trainer version "
            f"{trainer_version}"
        )
    rows = mask.any(dim=1)
    seq_max = torch.where(mask, lag, -1).amax(dim=1)[rows]
    counts = torch.bincount(token_lag)
    if num_bins is not None:
        if num_bins < 1:
            raise ValueError(f"num_bins must be >= 1, got {num_bins}")
        counts = torch.cat([counts, counts.new_zeros(num_bins)])
        counts = torch.cat([counts[: num_bins - 1], counts[num_bins - 1 :].sum(0, keepdim=True)])
    return {
        "lag_mean": float(token_lag.double().mean()),
        "lag_max": int(token_lag.max()),
        "lag_seq_max_mean": float(seq_max.double().mean()),
        "lag_hist": [int(c) for c in counts],
    }
