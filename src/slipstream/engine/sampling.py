"""Token sampling with counter-based randomness, and the behaviour log-probability.

Randomness. Each request carries a seed; the noise for its t-th token is a hash of
(seed, t, vocabulary index), turned into Gumbel noise, and the token is
`argmax(logits / temperature + gumbel)` over the kept vocabulary (the Gumbel-max trick samples
exactly from the softmax). Nothing depends on which slot or batch a request lands in, so a
request sampled inside a continuous batch gives the same tokens as sampled alone, and a run is
reproducible from its seeds.

Behaviour log-probability. We record `log softmax(logits / temperature)[token]`: the same
temperature-scaled distribution the trainer evaluates, so an on-policy ratio is exactly 1.
What top-k and top-p do to the importance ratio: they sample from the truncated distribution
`mu(a) = p(a) / Z` on the kept set (Z <= 1 its mass), but the recorded log-prob is `log p(a)`,
without the `-log Z` renormalisation. The trainer's ratio `pi/p` is then `Z` times the true
ratio `pi/mu`: biased low by the dropped mass, per token. With the defaults (top_p=1,
top_k=0) Z = 1 and there is no bias; keep them for RL, or accept the bias knowingly.
"""

from __future__ import annotations

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


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens `[B]` and their behaviour log-probs `[B]` from last-position logits `[B, V]`.

    Rows with temperature 0 are greedy; their log-prob is taken at temperature 1.
    """
    logits = logits.float()
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    scaled = logits / t
    logp_all = scaled.log_softmax(dim=-1)
    kept = filter_logits(scaled, top_k, top_p)
    noisy = kept + gumbel_noise(seeds, steps, logits.shape[-1]).to(kept.dtype)
    tokens = torch.where(greedy, scaled.argmax(dim=-1), noisy.argmax(dim=-1))
    return tokens, logp_all.gather(-1, tokens[:, None]).squeeze(-1)
