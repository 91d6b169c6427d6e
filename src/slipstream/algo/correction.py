"""The rollout correction: the behaviour weight `w = pi_prox / mu` and what is done with it.

Asynchronous RL trains on tokens sampled by a policy `mu` that is not the trainer's: older
weights (staleness) or other numerics (a bfloat16 engine, other kernels). The decoupled
objective (AReaL, Fu et al. 2025) splits the importance ratio in two: the trust-region ratio
`pi_theta / pi_prox`, which the loss clips, and the detached behaviour weight
`w = pi_prox / mu`, which corrects the sampling distribution. Every way the field corrects
`w` is one `CorrectionSpec` (docs/algorithms.md, "Rollout correction"):

- `level`: `token` (one weight per token), `sequence` (the product over a sequence's tokens),
  `geometric` (the geometric mean of a sequence's token weights, `exp(mean_t log w_t)`);
- `action`: `truncate` (`min(w, high)`: truncated importance sampling, TIS; Yao et al. 2025
  use token level at 2) or `mask` (tokens, or whole sequences at the sequence levels, whose
  weight lies outside `[low, high]` leave the loss and its denominators; kept ones keep their
  weight: masked importance sampling, MIS, and IcePop's two-sided mask).

`mismatch/kl` is the k3 estimator `mean(w - 1 - log w)` of KL(mu || pi_prox) over the valid
tokens (Schulman 2020): 0 when the sampler is the proximal policy, whatever the loss does.
Pure tensor math; inputs are `[B, T]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

LEVELS = ("token", "sequence", "geometric")
ACTIONS = ("truncate", "mask")
LOG_W_CLAMP = 20.0  # exp(20) ~ 5e8: a bound on a weight that no finite cap undoes


@dataclass(frozen=True)
class CorrectionSpec:
    """How the behaviour weight is applied. `low=None` means `1 / high` (a mask symmetric in
    log space); `low` only matters for `action="mask"`."""

    level: str = "token"
    action: str = "truncate"
    low: float | None = None
    high: float = 2.0

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"correction level {self.level!r}; valid: {', '.join(LEVELS)}")
        if self.action not in ACTIONS:
            raise ValueError(f"correction action {self.action!r}; valid: {', '.join(ACTIONS)}")
        # 1 inside the bounds: an on-policy token (w = 1) is never masked
        if not self.high >= 1 or (self.low is not None and not 0 <= self.low <= 1):
            raise ValueError(
                f"correction bounds need 0 <= low <= 1 <= high, got low={self.low}, high={self.high}"
            )

    @property
    def lower(self) -> float:
        return 1.0 / self.high if self.low is None else self.low


@dataclass(frozen=True)
class Correction:
    """The detached weight and keep-mask of one (micro-)batch, with its metric sums."""

    weight: Tensor  # [B, T] detached, 0 outside `keep`
    keep: Tensor  # [B, T] bool: valid tokens the correction keeps
    metrics: dict[str, Tensor]  # sums over valid tokens (see `METRIC_REDUCTIONS`)


METRIC_REDUCTIONS: dict[str, str] = {
    "correction/masked_frac": "mean_valid",
    "correction/weight_mean": "mean_kept",
    "correction/weight_max": "max",
    "mismatch/kl": "mean_valid",
    "valid_tokens": "sum",
    "kept_tokens": "sum",
}
"""How each combines across micro-batches (`losses.merge_metrics`): `mean_valid` weighted by
`valid_tokens` (finite loss tokens, before the mask), `mean_kept` by `kept_tokens` (the ones the
correction keeps: the loss's own tokens, except for `dro` and `oapl`, which take no weight and
keep every valid token in the loss)."""


def log_weight(old_logp: Tensor, behavior_logp: Tensor, valid: Tensor, level: str) -> Tensor:
    """`[B, T]` log of the behaviour weight at `level`, broadcast over each sequence's tokens
    for the sequence levels. Entries outside `valid` are 0."""
    log_w = torch.where(valid, old_logp - behavior_logp, 0.0)
    if level == "token":
        return log_w
    total = log_w.sum(dim=1, keepdim=True)
    if level == "geometric":
        total = total / valid.sum(dim=1, keepdim=True).clamp(min=1)
    return torch.where(valid, total.expand_as(log_w), 0.0)


def apply(
    old_logp: Tensor, behavior_logp: Tensor, valid: Tensor, spec: CorrectionSpec
) -> Correction:
    """The behaviour weight of `spec` for tokens `valid` `[B, T]` (old and behaviour log-probs
    detached, finite where valid)."""
    old, beh = old_logp.detach(), behavior_logp.detach()
    log_w = log_weight(old, beh, valid, spec.level).clamp(-LOG_W_CLAMP, LOG_W_CLAMP)
    w = log_w.exp()
    if spec.action == "truncate":
        keep = valid
        w = w.clamp(max=spec.high)
    else:
        keep = valid & (w >= spec.lower) & (w <= spec.high)
    w = torch.where(keep, w, 0.0)
    # k3 of KL(mu || pi_prox) per token, always at token level: what the sampler got wrong
    tok = torch.where(valid, old - beh, 0.0).clamp(-LOG_W_CLAMP, LOG_W_CLAMP)
    k3 = torch.where(valid, (torch.expm1(tok) - tok).clamp(min=0), 0.0)  # >= 0, exact near 0
    n = valid.sum().to(w.dtype)
    per = n.clamp(min=1)
    kept = keep.sum().to(w.dtype)
    metrics = {
        "correction/masked_frac": (valid & ~keep).sum().to(w.dtype) / per,
        "correction/weight_mean": w.sum() / kept.clamp(min=1),
        "correction/weight_max": w.max() if w.numel() else w.sum(),
        "mismatch/kl": k3.sum() / per,
        "valid_tokens": n,
        "kept_tokens": kept,
    }
    return Correction(w, keep, metrics)


def loglinear_proximal(
    behavior_logp: Tensor, logp: Tensor, token_lag: Tensor, valid: Tensor
) -> Tensor:
    """AReaL's log-linear approximation of the proximal log-probs, no extra forward pass.

    The proximal policy is the weights at the start of the step (version v), the current one
    is what the step moves toward (v + 1), and a token of lag `l = v - v_token` was sampled
    under version v - l. Interpolating by version in log space,
    `log pi_prox = log mu + a (log pi_theta - log mu)` with `a = l / (l + 1)`: a fresh token
    (l = 0) gets `pi_prox = mu` (no correction, the same gradient as no proximal policy), a
    stale one a proximal policy most of the way to the current one. `[B, T]`, detached.
    """
    lag = token_lag.clamp(min=0).to(logp.dtype)
    a = lag / (lag + 1)
    beh, cur = behavior_logp.detach(), logp.detach()
    return torch.where(valid, beh + a * (cur - beh), beh)
