"""Log-probs and entropy of the sampled tokens, from hidden states, a chunk of rows at a time.

The LM head's logits are the largest tensor of a training step: `[micro-batch, T, V]` float32
is 16 x 4096 x 151936 x 4 B = 40 GB for a Qwen2.5 micro-batch at 4k tokens, and autograd keeps
its softmax as well. Only completion positions carry a loss, and per position the loss needs
two numbers of the whole row: the target's logit and the log-sum-exp. So:

- the backbone returns final hidden states (`CausalLM.hidden`), and only the `N` completion
  positions (`loss_mask`) go through the head;
- `_ChunkedLogProb` computes their logits `rows` at a time in float32, keeps only the
  log-sum-exp `[N]` (and hidden states it was given), and recomputes each chunk's logits in
  the backward pass: `d logp_i / d z_ij = (1[j = target_i] - softmax(z_i)_j) / temperature`.

Peak memory of the head is then a few `[rows, V]` float32 buffers (`chunk_elements` logits
each, 16 MiB by default) plus `[N, hidden]`, whatever T and the micro-batch are. This is the
chunked cross-entropy of Liger-Kernel and of Wijmans et al. 2024 ("Cut Your Losses in
Large-Vocabulary Language Models"), without their fused kernels: it runs on any device.

Entropy is a diagnostic (`train/entropy`) and gets no gradient. Under `torch.autocast` the
two products run in the autocast dtype (bfloat16), the softmax in float32.
"""

from __future__ import annotations

from typing import Any

import torch

from slipstream.model.llama import CausalLM
from slipstream.types import Batch

CHUNK_ELEMENTS = 1 << 22
"""Logits per chunk: 4M float32 values = 16 MiB (128 rows of a 32k vocabulary)."""


def chunk_rows(vocab_size: int, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    """Rows of hidden states per chunk so that a chunk holds at most `chunk_elements` logits."""
    return max(1, chunk_elements // vocab_size)


def _logits(h_nH: torch.Tensor, w_VH: torch.Tensor, temperature: float) -> torch.Tensor:
    """Temperature-scaled float32 logits `[n, V]` of one chunk (product in `w_VH`'s dtype)."""
    z = h_nH.to(w_VH.dtype) @ w_VH.t()
    z = z.float() if z.dtype != torch.float32 else z
    return z.div_(temperature) if temperature != 1.0 else z


class _ChunkedLogProb(torch.autograd.Function):
    """`(h [N, H], w [V, H], targets [N]) -> (logp [N], entropy [N])`, chunk by chunk."""

    @staticmethod
    def forward(
        ctx: Any,
        h_NH: torch.Tensor,
        w_VH: torch.Tensor,
        targets_N: torch.Tensor,
        temperature: float,
        rows: int,
        compute_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        N = h_NH.shape[0]
        logp = torch.empty(N, dtype=torch.float32, device=h_NH.device)
        ent, lse = torch.empty_like(logp), torch.empty_like(logp)
        w = w_VH.to(compute_dtype)
        with torch.autocast(h_NH.device.type, enabled=False), torch.no_grad():
            for s in range(0, N, rows):
                z = _logits(h_NH[s : s + rows], w, temperature)
                lse_n = torch.logsumexp(z, dim=-1)
                lp = z.sub_(lse_n[:, None])  # log-softmax, in place of the logits
                logp[s : s + rows] = lp.gather(-1, targets_N[s : s + rows, None]).squeeze(-1)
                ent[s : s + rows] = -(lp.exp() * lp).sum(-1)  # H = -sum_j p_j log p_j
                lse[s : s + rows] = lse_n
        ctx.save_for_backward(h_NH, w_VH, targets_N, lse)
        ctx.temperature, ctx.rows, ctx.compute_dtype = temperature, rows, compute_dtype
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(
        ctx: Any, g_logp: torch.Tensor, _g_ent: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None, None]:
        h_NH, w_VH, targets_N, lse = ctx.saved_tensors
        temperature, rows, cdt = ctx.temperature, ctx.rows, ctx.compute_dtype
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h_NH) if need_h else None
        grad_w = (
            torch.zeros(w_VH.shape, dtype=torch.float32, device=w_VH.device) if need_w else None
        )
        w = w_VH.to(cdt)
        with torch.autocast(h_NH.device.type, enabled=False), torch.no_grad():
            for s in range(0, h_NH.shape[0], rows):
                h = h_NH[s : s + rows].to(cdt)
                z = _logits(h, w, temperature)
                g = g_logp[s : s + rows, None].float()
                # d(logp)/dz = onehot(target) - softmax(z); through z = x / T, a factor 1 / T
                dz = (z - lse[s : s + rows, None]).exp_().mul_(-g)
                dz.scatter_add_(-1, targets_N[s : s + rows, None], g)
                if temperature != 1.0:
                    dz /= temperature
                dz_c = dz.to(cdt)
                if grad_h is not None:
                    grad_h[s : s + rows] = (dz_c @ w).to(h_NH.dtype)
                if grad_w is not None:
                    grad_w += (dz_c.t() @ h).float()
        gw = grad_w.to(w_VH.dtype) if grad_w is not None else None
        return grad_h, gw, None, None, None, None


def chunked_logprobs(
    h_NH: torch.Tensor,
    w_VH: torch.Tensor,
    targets_N: torch.Tensor,
    temperature: float = 1.0,
    chunk_elements: int = CHUNK_ELEMENTS,
    compute_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of `targets_N [N]` and entropy `[N]` under `softmax(h_NH @ w_VH.T / temperature)`.

    Gradients flow to `h_NH [N, H]` and `w_VH [V, H]` (the LM head) through the log-probs only.
    `compute_dtype` (default: the autocast dtype when autocast is on, else `w_VH`'s) is the
    dtype of the two products; the softmax is float32 either way.
    """
    if compute_dtype is None:
        dev = h_NH.device.type
        on = torch.is_autocast_enabled(dev)
        compute_dtype = torch.get_autocast_dtype(dev) if on else w_VH.dtype
    t = temperature if temperature > 0 else 1.0
    rows = chunk_rows(w_VH.shape[0], chunk_elements)
    out = _ChunkedLogProb.apply(h_NH, w_VH, targets_N, t, rows, compute_dtype)
    return out[0], out[1]


def packed_hidden(model: CausalLM, batch: Batch) -> torch.Tensor:
    """Hidden states `[N, H]` of `batch`'s loss positions, from one padding-free row.

    Row r's first `w_r` inputs (up to its last loss position) are laid end to end into one
    row of `L = sum w_r` tokens, positions restarting at 0 for each and attention kept
    within each (`CausalLM.hidden(doc_ids=...)`), so the values equal the padded forward's
    while no product runs on padding.
    """
    mask = batch.loss_mask
    ids = batch.input_ids[:, :-1]
    B, T = mask.shape
    cols = torch.arange(1, T + 1, device=mask.device).expand(B, T)
    widths = (cols * mask).amax(dim=1).clamp(min=1)  # [B]
    keep = cols <= widths[:, None]  # [B, T]: the columns each row packs
    offsets = torch.cumsum(widths, 0) - widths  # [B]: where each row starts in the packed row
    flat = offsets[:, None] + cols - 1  # [B, T]: packed index of (r, t), valid where `keep`
    positions = (cols - 1)[keep][None]  # [1, L]
    doc_ids = torch.arange(B, device=mask.device)[:, None].expand(B, T)[keep][None]
    h_1LH = model.hidden(ids[keep][None], positions=positions, doc_ids=doc_ids)
    return h_1LH[0, flat[mask]]


def completion_logprobs(
    model: CausalLM,
    batch: Batch,
    temperature: float = 1.0,
    chunk_elements: int = CHUNK_ELEMENTS,
    packed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs `[B, T]` of `batch.targets` and entropy `[B, T]`, 0 outside `loss_mask`.

    The same values as `train.batch.token_logprobs` at every completion position (the
    temperature-scaled distribution the engine samples), computed from the hidden states of
    completion positions only, in chunks of `chunk_elements` logits; `packed` runs the
    backbone on one padding-free row (`packed_hidden`). `batch` must be on the model's device.
    """
    mask = batch.loss_mask
    h_NH = packed_hidden(model, batch) if packed else model.hidden(batch.input_ids[:, :-1])[mask]
    w = model.lm_head.weight
    logp_N, ent_N = chunked_logprobs(h_NH, w, batch.targets[mask], temperature, chunk_elements)
    zeros = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return zeros.masked_scatter(mask, logp_N), zeros.masked_scatter(mask, ent_N)
