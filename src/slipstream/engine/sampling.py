"""Token sampling with counter-based randomness, and the behaviour log-probability.

Randomness. Each request carries a seed; the noise for its t-th token is a hash of
(seed, t, vocabulary index), turned into Gumbel noise, and the token is
`argmax(logits / temperature + gumbel)` over the kept vocabulary (the Gumbel-max trick samples
exactly from the softmax). Nothing depends on which slot or batch a request lands in, so a
request sampled inside a continuous batch gives the same tokens as sampled alone, and a run is
reproducible from its seeds.

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


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer hash on int64 tensors holding 32-bit values."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def gumbel_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise `[B, V]` from request seeds `[B]` and token indices `[B]`."""
    v = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    key = _hash32(_hash32(seeds.to(torch.int64) * 0x9E3779B1 + steps.to(torch.int64))[:, None] + v)
    u = (key.double() + 0.5) / 4294967296.0  # in (0, 1)
    return -torch.log(-torch.log(u))


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
    drop |= mass_before >= top_p[:, None]  # always keeps the most likely token
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
    within its completion) are per row `[B]`. Rows with temperature 0 are greedy.
    """
    logits = logits.float()
    greedy = temperature <= 0
    all_greedy = bool(greedy.all())
    t = torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    scaled = logits / t
    logp_all = scaled.log_softmax(dim=-1)
    kept = filter_logits(scaled, top_k, top_p)
    if all_greedy:
        tokens = scaled.argmax(dim=-1)
    else:
        noisy = kept + gumbel_noise(seeds, steps, logits.shape[-1]).to(kept.dtype)
        tokens = torch.where(greedy, scaled.argmax(dim=-1), noisy.argmax(dim=-1))
    logmass = None
    if kept is not scaled:  # log Z = logsumexp over the kept set of the normalised log-probs
        logmass = (logp_all + (kept - scaled)).logsumexp(dim=-1)
    return Sampled(tokens, logp_all.gather(-1, tokens[:, None]).squeeze(-1), logmass)
