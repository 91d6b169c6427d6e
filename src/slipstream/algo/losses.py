"""Policy losses: per-token (or per-sequence) loss, aggregation, and diagnostic metrics.

`compute(method, logp, behavior_logp, adv, mask, ...)` returns a `LossOutput` whose `loss` is
a scalar to minimise. Formulas are the contract in docs/algorithms.md. Inputs are `[B, T]`:

- `logp`: log pi_theta under the current weights (carries grad);
- `behavior_logp`: log mu recorded by the sampler (possibly stale, possibly mixed versions);
- `old_logp` (optional): the proximal policy, recomputed by the trainer at the start of the step.

Decoupled correction for stale data (AReaL, Fu et al. 2025): when `old_logp` is given the
trust-region ratio is `r = exp(logp - old_logp)` and each token's loss is multiplied by the
detached behaviour weight `w = pi_prox / mu = exp(old_logp - behavior_logp)`, truncated or
masked as the `correction_spec` says (`algo.correction`: token, sequence or geometric level;
TIS truncation at 2 by default). Tokens the correction masks leave the loss and its
denominators. When `old_logp` is None the proximal policy is the sampler: `r = exp(logp -
behavior_logp)` and `w = 1`. `dro` and `oapl` regress against `behavior_logp` by definition and
take no weight (their correction metrics are still reported).

Sequence-level losses (`gspo`, `oapl`) compute one loss per sequence and broadcast it to the
sequence's masked tokens, so every `agg` applies unchanged; their default `seq-mean-token-mean`
is then exactly `mean_i loss_i` over sequences (GSPO, Zheng et al. 2025).

Micro-batching: pass `num_tokens` (masked tokens of the whole step) and `num_seqs` (sequences of
the whole step) to every micro-batch and *sum* the micro-batch losses; the gradient then equals
one big batch's for every `agg`. Left as None they are counted on this call, dropping tokens
with non-finite inputs and rows with no loss token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from slipstream.algo import correction
from slipstream.algo.correction import CorrectionSpec

LOG_RATIO_CLAMP = 20.0
SPEC = CorrectionSpec()  # the field's default: token-level truncation at 2 (TIS)
AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum-norm")

METRIC_REDUCTIONS: dict[str, str] = {
    "clip_frac": "mean",
    "ratio_mean": "mean",
    "ratio_max": "max",
    "approx_kl": "mean",
    "nonfinite_tokens": "sum",
    "tokens": "sum",
    "seqs": "sum",
    **correction.METRIC_REDUCTIONS,
}
"""How each metric combines across micro-batches; "mean" is weighted by `tokens`. `tokens` and
`seqs` count the tokens and rows left in the loss (valid, kept by the correction)."""


@dataclass
class LossOutput:
    """A scalar loss with grad, detached metrics as 0-dim tensors (see `METRIC_REDUCTIONS`;
    `to_floats` reads them as floats, docs/algorithms.md says why), and the loss's tokens
    before the correction (`finite_tokens`), so that a caller need not recompute them."""

    loss: Tensor
    metrics: dict[str, Tensor]
    valid: Tensor  # [B, T] bool: masked and finite, before the correction's mask


@dataclass(frozen=True)
class LossInputs:
    """What a per-token loss sees; every `[B, T]` entry outside `valid` is a finite 0."""

    logp: Tensor  # [B, T] with grad
    behavior_logp: Tensor  # [B, T] detached
    old_logp: Tensor  # [B, T] detached: the proximal policy, or behavior_logp
    ratio: Tensor  # [B, T] exp(clamp(logp - old_logp)), with grad
    adv: Tensor  # [B, T] detached
    valid: Tensor  # [B, T] bool: masked and finite


LossFn = Callable[[LossInputs, Mapping[str, Any]], tuple[Tensor, Tensor]]
"""(inputs, settings) -> (loss `[B, T]`, clipped `[B, T]` bool)."""


def _masked_seq_mean(x: Tensor, valid: Tensor) -> Tensor:
    """`[B, T]` -> `[B]`: mean over each row's valid entries (0 for an empty row)."""
    return torch.where(valid, x, 0.0).sum(1) / valid.sum(1).clamp(min=1)


def _per_token(seq: Tensor, like: Tensor) -> Tensor:
    return seq[:, None].expand_as(like)


def _reinforce(x: LossInputs, hp: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    r = x.ratio.detach()
    return -r.clamp(max=hp["cap"]) * x.adv * x.logp, r > hp["cap"]


def _clipped_surrogate(ratio: Tensor, adv: Tensor, hp: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """PPO's pessimistic clipped loss (Schulman et al. 2017), with the optional dual clip
    (Ye et al. 2020) that bounds the loss of negative-advantage tokens by `-adv * c`."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - hp["eps_low"], 1 + hp["eps_high"])
    loss = torch.maximum(unclipped, clipped)
    cut = clipped > unclipped
    c = hp["dual_clip"]
    if c is not None:
        if c <= 1:
            raise ValueError(f"dual_clip must be > 1, got {c}")
        floor = -adv * c
        dual = (adv < 0) & (loss > floor)
        loss = torch.where(dual, floor, loss)
        cut = cut | dual
    return loss, cut


def _ppo(x: LossInputs, hp: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    return _clipped_surrogate(x.ratio, x.adv, hp)


def _cispo(x: LossInputs, hp: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    # CISPO (MiniMax-M1, 2025): clip the detached IS weight, never the token, so rare
    # high-ratio "fork" tokens keep a gradient that PPO's clip would zero.
    r = x.ratio.detach()
    coef = r.clamp(hp["lo"], hp["hi"])
    return -coef * x.adv * x.logp, (r < hp["lo"]) | (r > hp["hi"])


def _dro(x: LossInputs, hp: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    # Direct reward optimisation with a quadratic tether to the sampler (Richemond et al. 2024):
    # no ratio, so nothing to clip and nothing that explodes under lag.
    drift = x.logp - x.behavior_logp
    return -(x.adv * x.logp - hp["beta"] / 2 * drift**2), torch.zeros_like(x.valid)


def _gspo(x: LossInputs, hp: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    # GSPO (Zheng et al. 2025): one length-normalised ratio per sequence, clipped per sequence.
    seq_log_ratio = _masked_seq_mean(x.logp - x.old_logp, x.valid)
    s = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    loss, cut = _clipped_surrogate(s, _masked_seq_mean(x.adv, x.valid), hp)
    return _per_token(loss, x.logp), _per_token(cut, x.valid)


def _oapl(x: LossInputs, hp: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    # Optimal-advantage regression (A*-PO, Brantley et al. 2025) against the sampler:
    # a least-squares loss with no importance weight, so it stays bounded under any lag.
    seq_log_ratio = torch.where(x.valid, x.logp - x.behavior_logp, 0.0).sum(1)
    loss = (hp["beta"] * seq_log_ratio - _masked_seq_mean(x.adv, x.valid)) ** 2
    return _per_token(loss, x.logp), torch.zeros_like(x.valid)


@dataclass(frozen=True)
class LossMethod:
    """A registered loss: its function, settings with defaults, default agg, and whether it
    takes the decoupled behaviour weight (and the correction's mask)."""

    fn: LossFn
    defaults: Mapping[str, Any]
    agg: str = "token-mean"
    behavior_weight: bool = True


_PPO = LossMethod(_ppo, {"eps_low": 0.2, "eps_high": 0.2, "dual_clip": None})

METHODS: dict[str, LossMethod] = {
    "reinforce": LossMethod(_reinforce, {"cap": math.inf}),
    "ppo": _PPO,
    # DAPO §3.1 clip-higher: a wider upper bound lets low-probability tokens grow (entropy).
    "dapo": replace(_PPO, defaults={**_PPO.defaults, "eps_high": 0.28}),
    "cispo": LossMethod(_cispo, {"lo": 0.0, "hi": 5.0}),
    "dro": LossMethod(_dro, {"beta": 0.05}, behavior_weight=False),
    "gspo": LossMethod(
        _gspo, {"eps_low": 3e-4, "eps_high": 4e-4, "dual_clip": None}, agg="seq-mean-token-mean"
    ),
    "oapl": LossMethod(_oapl, {"beta": 1.0}, agg="seq-mean-token-mean", behavior_weight=False),
}
"""The losses by name."""


def _settings(method: str, hp: Mapping[str, Any]) -> tuple[LossMethod, dict[str, Any]]:
    if method not in METHODS:
        raise ValueError(f"unknown loss method {method!r}; valid: {', '.join(METHODS)}")
    spec = METHODS[method]
    unknown = sorted(set(hp) - set(spec.defaults))
    if unknown:
        raise ValueError(
            f"loss {method!r} takes no setting {unknown}; valid: {list(spec.defaults)}"
        )
    return spec, {**spec.defaults, **hp}


def normaliser(
    agg: str, *, tokens: int | Tensor, seqs: int | Tensor, max_len: int | None = None
) -> Tensor:
    """The denominator of `agg` for a step of `tokens` loss tokens in `seqs` sequences.

    - `token-mean`: `tokens`; every token weighs the same, which removes the length bias of
      per-sequence means (DAPO §3.3).
    - `seq-mean-token-mean`, `seq-mean-token-sum`: `seqs`.
    - `token-sum-norm`: `seqs * max_len` with a constant `max_len` (`sampling.max_new_tokens`),
      so a sequence's weight does not depend on the lengths of the others (Dr. GRPO §3.1).
    """
    if agg not in AGGS:
        raise ValueError(f"unknown agg {agg!r}; valid: {', '.join(AGGS)}")
    n = tokens if agg == "token-mean" else seqs
    t = torch.as_tensor(n, dtype=torch.float32).clamp(min=1)
    if agg != "token-sum-norm":
        return t
    if max_len is None or max_len <= 0:
        raise ValueError(f"agg 'token-sum-norm' needs a positive max_len, got {max_len}")
    return t * max_len


def aggregate(
    loss_T: Tensor,
    mask: Tensor,
    agg: str,
    *,
    num_tokens: int | Tensor | None = None,
    num_seqs: int | Tensor | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Reduce a per-token loss `[B, T]` over `mask` `[B, T]` to a scalar: the sum of `agg`
    (`sum(mask*l)`, or `sum_i sum_t(mask*l) / sum_t mask` for `seq-mean-token-mean`) over
    `normaliser(agg, ...)`. `num_tokens` / `num_seqs` default to this call's masked tokens /
    rows with a masked token; pass the whole step's to micro-batches.
    """
    mask = mask.bool()
    # where(), not a product: a masked inf or nan must not reach the sum.
    masked = torch.where(mask, loss_T, 0.0)
    if agg == "seq-mean-token-mean":
        total = (masked.sum(1) / mask.sum(1).clamp(min=1)).sum()
    else:
        total = masked.sum()
    tokens = mask.sum() if num_tokens is None else num_tokens
    seqs = mask.any(dim=1).sum() if num_seqs is None else num_seqs
    return total / normaliser(agg, tokens=tokens, seqs=seqs, max_len=max_len).to(total)


def finite_tokens(
    logp: Tensor,
    behavior_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    old_logp: Tensor | None = None,
) -> Tensor:
    """`[B, T]` bool: the tokens of `mask` whose `logp`, `behavior_logp`, `adv` (`[B]` or
    `[B, T]`) and `old_logp` (when given) are finite, the tokens the loss sees before the
    correction. The rest are dropped from everything the step computes, and a sequence is made
    of its finite tokens (its sums in the correction, `gspo`, `oapl`, the staleness metrics):
    each of these is a sum or mean over tokens, defined over the finite ones, so one bad token
    (a -inf behaviour log-prob, a nan) does not discard the sequence's other tokens."""
    adv_ok = adv.isfinite()
    valid = mask.bool() & logp.isfinite() & behavior_logp.isfinite()
    valid = valid & (adv_ok[:, None] if adv.dim() == 1 else adv_ok)
    return valid if old_logp is None else valid & old_logp.isfinite()


def _prepare(
    logp: Tensor, behavior_logp: Tensor, adv: Tensor, mask: Tensor, old_logp: Tensor | None
) -> LossInputs:
    """Broadcast `adv`, drop non-finite tokens, and zero everything outside the valid mask
    (with where(), so a nan input cannot leak into the gradient of a valid token). The math runs
    in float32 at least: bf16 cannot even count 300 tokens exactly."""
    shapes = [tuple(t.shape) for t in (logp, behavior_logp, mask)]
    if logp.dim() != 2 or len(set(shapes)) != 1 or adv.shape[0] != logp.shape[0]:
        raise ValueError(
            f"logp, behavior_logp, mask must share a [B, T] shape and adv be [B] or [B, T]; "
            f"got {shapes} and adv {tuple(adv.shape)}"
        )
    logp = logp.to(torch.promote_types(logp.dtype, torch.float32))
    adv = adv.detach().to(logp.dtype)
    adv = adv[:, None].expand_as(logp) if adv.dim() == 1 else adv
    valid = finite_tokens(logp, behavior_logp, adv, mask, old_logp)
    zero = torch.zeros_like(logp, requires_grad=False)
    beh = torch.where(valid, behavior_logp.detach(), zero)
    old = beh if old_logp is None else torch.where(valid, old_logp.detach(), zero)
    logp = torch.where(valid, logp, zero)
    ratio = (logp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    return LossInputs(logp, beh, old, ratio, torch.where(valid, adv, zero), valid)


def _metrics(x: LossInputs, cut: Tensor, nonfinite: Tensor) -> dict[str, Tensor]:
    valid = x.valid
    n = valid.sum().to(x.logp.dtype)
    per_token = n.clamp(min=1)
    r = torch.where(valid, x.ratio.detach(), 0.0)
    # k3 estimator of the drift from the sampler (Schulman 2020), always against behavior_logp;
    # expm1, as correction.apply: exp(x) - 1 - x cancels to 0 (or below) in float32 near x = 0.
    log_rb = (x.logp.detach() - x.behavior_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    kl = torch.where(valid, (torch.expm1(log_rb) - log_rb).clamp(min=0), 0.0)
    return {
        "clip_frac": (cut & valid).sum() / per_token,
        "ratio_mean": r.sum() / per_token,
        "ratio_max": r.max() if r.numel() else r.sum(),
        "approx_kl": kl.sum() / per_token,
        "nonfinite_tokens": nonfinite.sum().to(x.logp.dtype),
        "tokens": n,
        "seqs": valid.any(dim=1).sum().to(x.logp.dtype),
    }


def compute(
    method: str,
    logp: Tensor,
    behavior_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    old_logp: Tensor | None = None,
    correction_spec: CorrectionSpec | None = None,
    agg: str | None = None,
    num_tokens: int | Tensor | None = None,
    num_seqs: int | Tensor | None = None,
    max_len: int | None = None,
    **hp: Any,
) -> LossOutput:
    """The `method` loss of one (micro-)batch.

    Shapes: `logp`, `behavior_logp`, `old_logp`, `mask` `[B, T]`; `adv` `[B]` or `[B, T]`.
    `old_logp` is the proximal policy (None: the sampler is the proximal policy, `w = 1`);
    `correction_spec` how its behaviour weight applies (None: token-level truncation at 2).
    `agg` None picks the method's default (`token-mean`; `seq-mean-token-mean` for gspo, oapl).
    `hp` are the method's settings (see `METHODS[method].defaults`).
    A token whose `logp`, `behavior_logp`, `old_logp` or `adv` is not finite is dropped from the
    loss and from the counted denominators, and reported in `metrics["nonfinite_tokens"]`;
    so is a token (or sequence) the correction masks (`metrics["correction/masked_frac"]`),
    except under `dro` and `oapl`, which take no weight: their correction metrics describe the
    weight and mask they do not apply (docs/algorithms.md, "Rollout correction").
    """
    spec, settings = _settings(method, hp)
    x = _prepare(logp, behavior_logp, adv, mask, old_logp)
    finite = x.valid
    nonfinite = mask.bool() & ~finite
    corr = correction.apply(x.old_logp, x.behavior_logp, x.valid, correction_spec or SPEC)
    if spec.behavior_weight:
        x = replace(x, valid=corr.keep)
    loss_T, cut_T = spec.fn(x, settings)
    if spec.behavior_weight:
        loss_T = loss_T * corr.weight
    loss = aggregate(
        loss_T,
        x.valid,
        spec.agg if agg is None else agg,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        max_len=max_len,
    )
    return LossOutput(loss, {**_metrics(x, cut_T, nonfinite), **corr.metrics}, finite)


def merge_metrics(parts: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """Combine micro-batch metrics exactly by `METRIC_REDUCTIONS` (means weighted by tokens)."""
    weights = {
        "mean": torch.stack([p["tokens"] for p in parts]),
        "mean_valid": torch.stack([p["valid_tokens"] for p in parts]),
        "mean_kept": torch.stack([p["kept_tokens"] for p in parts]),
    }
    merged: dict[str, Tensor] = {}
    for name, how in METRIC_REDUCTIONS.items():
        values = torch.stack([p[name] for p in parts])
        if how == "sum":
            merged[name] = values.sum()
        elif how == "max":
            merged[name] = values.max()
        else:
            w = weights[how]
            merged[name] = (values * w).sum() / w.sum().clamp(min=1)
    return merged


def to_floats(metrics: Mapping[str, Tensor | float]) -> dict[str, float]:
    """Python floats for logging, at the edge (this syncs with the device)."""
    return {k: float(v) for k, v in metrics.items()}
