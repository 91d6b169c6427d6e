"""Token sampling with counter-based randomness, and the behaviour log-probability.

Randomness. Each request carries a seed; its t-th token takes one uniform number `u`, a hash
of (seed, t), and is the inverse-CDF draw from the softmax of its row: the first token `a`
whose cumulative probability exceeds `u` (this samples exactly from the softmax). The row's
computation reads only that row, always in the same order (the vocabulary in fixed chunks of
`CHUNK`: exponentials, chunk sums, then the cumulative sum inside the chunk `u` falls in), so a
request sampled inside a continuous batch gives the same tokens as sampled alone, and a run is
reproducible from its seeds. One uniform per row instead of one Gumbel variate per vocabulary
entry: at a 151,936-token vocabulary, hashing the whole `[rows, vocab]` table cost several
times the decode step's own matrix products on a CPU. On a CPU the chunks stay in cache and no
`[rows, vocab]` temporary is allocated; elsewhere the whole row is one chunk (fewer kernels).

Behaviour log-probability. We record `log p(a)`, `p = softmax(logits / temperature)` over the
whole vocabulary: the distribution the trainer evaluates (`train.batch.token_logprobs`), so
with identical weights the trainer's ratio is exactly 1.

What top-k and top-p do to the importance ratio. With either on, the token is drawn from the
truncated distribution `mu(a) = p(a) / Z` on the kept set K (`Z = sum_{a in K} p(a) <= 1`, per
token, computed on the temperature-scaled logits: temperature first, then the filters, as in
vLLM and `transformers`). The recorded log-prob stays `log p(a)`, so the ratio the trainer forms,
`pi(a) / p(a)`, is the true importance ratio `pi(a) / mu(a)` divided by `Z`: it reads 1
on-policy where the truth is `Z`, and it is biased upward by `1 / Z` off-policy. Tokens outside
K have `mu = 0` and are never sampled, so no ratio corrects for them: the update follows the
truncated policy. Each completion also records `log Z` per token (`kept_logmass`, 0 without
filtering); the recorded log-prob minus it is `log mu(a)`, the exact behaviour log-prob, for
a caller that wants the unbiased ratio. Defaults (top_k 0, top_p 1) give Z = 1: keep them for
RL, or accept the bias knowingly.

Greedy rows (temperature 0) take the argmax and record the log-prob at temperature 1; they are
for evaluation, not for RL.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

_MASK32 = 0xFFFFFFFF
LOG2E = 1.4426950408889634
CHUNK = 4096  # vocabulary entries per chunk on a CPU (a [rows, CHUNK] scratch stays in cache)


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer hash on int64 tensors holding 32-bit values."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def row_uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One uniform number in (0, 1) per row `[B]` (float64) from request seeds and token
    indices `[B]`."""
    key = _hash32(_hash32(seeds.to(torch.int64) * 0x9E3779B1 + steps.to(torch.int64)) + 0x2545F491)
    return (key.double() + 0.5) / 4294967296.0


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k / nucleus to -inf. `top_k` 0 and `top_p` 1 keep all."""
    if bool((top_k <= 0).all()) and bool((top_p >= 1.0).all()):
        return logits
    V = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(V, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, V))[:, None]
    drop = rank >= k
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # always keeps the most likely token; a row with top_p 1 keeps all (its cumulative mass
    # can round to 1 before the end, which must not cut its tail when a neighbour filters)
    drop |= (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


class Sampled(NamedTuple):
    tokens: torch.Tensor  # [B] long
    logp: torch.Tensor  # [B] log p(token), p the temperature-scaled full softmax
    kept_logmass: torch.Tensor | None  # [B] log Z of the top-k / top-p set; None: no filter


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
) -> Sampled:
    """Next tokens `[B]` and their behaviour log-probs `[B]` from last-position logits `[B, V]`.

    `temperature`, `top_k`, `top_p`, `seeds` and `steps` (the index of the token being sampled
    within its completion) are per row `[B]`. Rows with temperature 0 are greedy. `logits` is
    not modified.

    Every row goes through the same arithmetic, filtered or not: `e = exp(x / t - m)` with
    `m = max(x) / t` (the row's largest scaled logit: scaling by `1 / t > 0` keeps the order),
    zeroed outside the kept set, so a row's token does not depend on whether a neighbour in
    the batch filters. The recorded log-prob is `x_a / t - m - log sum(e)` over the whole row,
    computed with a float64 sum of float32 chunk sums (closer to the exact value than a float32
    `log_softmax`).
    """
    logits = logits.float()
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)[:, None].float()
    inv_t = 1.0 / t
    top = logits.amax(dim=-1, keepdim=True)
    neg_m = -(top * inv_t)  # [B, 1]
    # the exponentials in base 2: exp(y) = 2^(y log2 e), and exp2 runs about 25 % faster than
    # exp on a CPU; the exponent's extra rounding is a relative 1e-7 of it
    inv_t2 = inv_t * LOG2E
    neg_m2 = -(top * inv_t2)
    filtered = not (bool((top_k <= 0).all()) and bool((top_p >= 1.0).all()))
    keep = torch.isfinite(filter_logits(logits / t, top_k, top_p)) if filtered else None
    chunk = CHUNK if logits.device.type == "cpu" else logits.shape[-1]
    full, kept = _chunk_sums(logits, inv_t2, neg_m2, keep, chunk)  # [B, C] each
    log_full = full.sum(dim=-1).log()  # log sum_a exp(x_a / t - m), float64
    if bool(greedy.all()):
        tokens = logits.argmax(dim=-1)
    else:
        tokens = _draw(logits, inv_t2, neg_m2, keep, kept, row_uniform(seeds, steps), chunk)
        if bool(greedy.any()):
            tokens = torch.where(greedy, logits.argmax(dim=-1), tokens)
    s_a = torch.addcmul(neg_m, logits.gather(-1, tokens[:, None]), inv_t)  # x_a / t - m
    logp = (s_a.squeeze(-1).double() - log_full).float()
    logmass = (kept.sum(dim=-1).log() - log_full).float() if filtered else None
    return Sampled(tokens, logp, logmass)


def _exp_chunk(
    x: torch.Tensor, inv_t: torch.Tensor, neg_m: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """`exp(x / t - m)` of a `[B, n]` slice of logits, given `inv_t` and `neg_m` in base 2
    (`log2 e / t` and `-m log2 e`): a product, the shift and `exp2` in place, into `out` when
    given. (A product then an add runs twice as fast as `addcmul` with these broadcast `[B, 1]`
    factors on a CPU, and the row's largest entry comes out exactly 0: `2^0 = 1`.)"""
    return torch.mul(x, inv_t, out=out).add_(neg_m).exp2_()


def _chunk_sums(
    logits: torch.Tensor,
    inv_t: torch.Tensor,
    neg_m: torch.Tensor,
    keep: torch.Tensor | None,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-chunk sums `[B, C]` (float64) of `exp(x / t - m)` over the whole row and over the
    kept set (the same tensor when nothing is filtered)."""
    B, V = logits.shape
    n_chunks = -(-V // chunk)
    full = torch.empty(B, n_chunks, dtype=torch.float64, device=logits.device)
    kept = full if keep is None else torch.empty_like(full)
    scratch = torch.empty(B, min(chunk, V), dtype=torch.float32, device=logits.device)
    for c in range(n_chunks):
        a, b = c * chunk, min((c + 1) * chunk, V)
        e = _exp_chunk(logits[:, a:b], inv_t, neg_m, scratch[:, : b - a])
        full[:, c] = e.sum(dim=-1)
        if keep is not None:
            kept[:, c] = e.masked_fill_(~keep[:, a:b], 0.0).sum(dim=-1)
    return full, kept


def _draw(
    logits: torch.Tensor,
    inv_t: torch.Tensor,
    neg_m: torch.Tensor,
    keep: torch.Tensor | None,
    sums: torch.Tensor,
    u: torch.Tensor,
    chunk: int,
) -> torch.Tensor:
    """Inverse-CDF draw `[B]`: the chunk where `u x total` falls, then the entry inside it
    (the entry's exponentials recomputed, in float64 cumulative sums)."""
    B, V = logits.shape
    rows = torch.arange(B, device=logits.device)
    cum = sums.cumsum(dim=-1)  # [B, C]
    target = u * cum[:, -1]
    c = _first_above(cum, target)
    before = torch.where(c > 0, cum[rows, (c - 1).clamp(min=0)], torch.zeros_like(target))
    cols = c[:, None] * chunk + torch.arange(min(chunk, V), device=logits.device)[None, :]
    inside = cols < V
    cols = cols.clamp(max=V - 1)
    e = _exp_chunk(logits.gather(-1, cols), inv_t, neg_m)
    mass = inside if keep is None else inside & keep.gather(-1, cols)
    e = e.masked_fill_(~mass, 0.0).double()
    return cols[rows, _first_above(e.cumsum(dim=-1), target - before)]


def _first_above(cum: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Per row of non-decreasing `cum` `[B, n]`, the first index whose entry exceeds `value`
    `[B]`. `value` is first held below the row's last entry, so the index always has a term
    `cum[i] - cum[i - 1] > 0` (rounding can put `u x total` past the end; the draw then takes
    the last entry with mass, never one with probability 0)."""
    last = cum[:, -1]
    value = torch.minimum(value.clamp(min=0.0), torch.nextafter(last, torch.zeros_like(last)))
    return torch.searchsorted(cum, value[:, None].contiguous(), right=True).squeeze(-1)
