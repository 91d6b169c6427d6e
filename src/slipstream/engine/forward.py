"""The engine's cached forward pass: a slot KV cache laid out for decode, over the model's weights.

`CausalLM.forward(..., cache=KVCache)` serves any ragged batch, but pays for that generality on
every decode step: it gathers each row's keys and values out of the cache (`ck[slots, :span]`),
repeats them per query head, pads every row to the longest and computes logits at every
position. This module runs the same layers on the model's own parameter tensors (read at each
call, so an in-place weight update is seen at once) and differs where generation needs it:

- the cache is `[S + 1, kv_heads, L, head_dim]` per layer, so the keys of a contiguous range of
  slots up to `span` are a strided *view* that attention reads in place; a sparse set of slots
  is gathered (a copy of `span` positions, never of the whole cache). Slot `S` is scratch: the
  rows of free slots that ride along in a decode range write there, never into a live slot;
- a forward is one flat list of tokens for every projection and MLP, in *parts* that differ
  only in attention: a decode part (one token per row) and a prefill part (whole prompts,
  padded for attention only). A decode step and the prefill of newly admitted prompts are one
  forward, with no padding in the matrix products;
- grouped-query attention folds the query heads that share a key/value head into the query
  axis (`[R, kv_heads, heads_per_kv * T, head_dim]`): keys and values are never repeated;
- the LM head runs only at the tokens whose next token is sampled.

The arithmetic of each layer is the model's, so the engine's log-probs equal the trainer's
recomputation (tests/test_engine.py holds that at 1e-5, for Llama, Qwen2 and Qwen3 shapes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F

from slipstream.model.llama import CausalLM, DecoderLayer, ModelConfig, RMSNorm


class SlotKV:
    """Keys and values of a pool of slots, per layer `[S + 1, kv_heads, L, head_dim]` (S: scratch)."""

    def __init__(
        self, cfg: ModelConfig, num_slots: int, max_len: int, dtype: torch.dtype, device: Any
    ) -> None:
        assert cfg.head_dim is not None
        shape = (num_slots + 1, cfg.num_key_value_heads, max_len, cfg.head_dim)
        n = cfg.num_hidden_layers
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)]
        # writes go through flat views `[(S + 1) * kv_heads * L, head_dim]`: one index_copy_
        self.k_flat = [t.view(-1, cfg.head_dim) for t in self.k]
        self.v_flat = [t.view(-1, cfg.head_dim) for t in self.v]
        self.num_slots, self.max_len, self.kv_heads = num_slots, max_len, cfg.num_key_value_heads
        self.scratch = num_slots


@dataclass
class Part:
    """Rows that share one attention call: `R` rows of `T` new tokens (T = 1: decode)."""

    slots: slice | torch.Tensor  # [R] cache rows read: a slice (a view) or indices (a gather)
    rows: int  # R
    T: int  # padded new tokens per row
    n_tokens: int  # real tokens (R when T == 1)
    pad_index: torch.Tensor | None  # [n_tokens] place of each real token in [R * T]; T == 1: None
    mask: torch.Tensor  # [R, 1, T, span]: key j visible to a token at position p iff j <= p
    span: int  # cache positions read: max position + 1


@dataclass
class Plan:
    """One forward: the flat tokens, where they go, their attention parts, what to logit."""

    ids: torch.Tensor  # [N] token ids, parts concatenated
    positions: torch.Tensor  # [N]
    write_at: torch.Tensor  # [N * kv_heads] flat cache index of each token's key/value
    parts: list[Part]
    out_index: torch.Tensor | None  # [M] tokens whose next-token logits are wanted; None: none


# A part with the cache slot `[n]` and position `[n]` of each of its tokens.
PartRows = tuple[Part, torch.Tensor, torch.Tensor]


def decode_part(
    cache: SlotKV, slots: slice | torch.Tensor, pos: torch.Tensor, live: torch.Tensor
) -> PartRows:
    """One token per row at `pos [R]`; rows with `live` 0 write to scratch. Part, slot ids, pos."""
    dev = pos.device
    if isinstance(slots, slice):
        slot_ids = torch.arange(slots.start, slots.stop, device=dev)
    else:
        slot_ids = slots
    write_slot = torch.where(live.bool(), slot_ids, cache.scratch)
    span = int(pos.max()) + 1
    mask = (torch.arange(span, device=dev)[None, :] <= pos[:, None])[:, None, None, :]
    part = Part(slots, pos.shape[0], 1, pos.shape[0], None, mask, span)
    return part, write_slot, pos


def prefill_part(
    cache: SlotKV, slots: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor
) -> PartRows:
    """`lens[r]` tokens per row written from `starts[r]`. Part, slot id and position per token."""
    dev = starts.device
    R, T = starts.shape[0], int(lens.max())
    t = torch.arange(T, device=dev)
    pad_pos = starts[:, None] + t[None, :]  # [R, T]
    real = (t[None, :] < lens[:, None]).reshape(-1)
    pad_index = real.nonzero().squeeze(1)
    span = int((starts + lens).max())
    mask = (torch.arange(span, device=dev)[None, None, :] <= pad_pos[:, :, None])[:, None]
    part = Part(slots, R, T, int(lens.sum()), pad_index, mask, span)
    return part, slots.repeat_interleave(lens), pad_pos.reshape(-1)[pad_index]


def make_plan(
    cache: SlotKV,
    ids: torch.Tensor,
    parts: list[PartRows],
    out_index: torch.Tensor | None,
) -> Plan:
    """Join parts (each from `decode_part` / `prefill_part`) over the flat token ids `[N]`."""
    slot = torch.cat([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
    pos = torch.cat([p[2] for p in parts]) if len(parts) > 1 else parts[0][2]
    H, L = cache.kv_heads, cache.max_len
    heads = torch.arange(H, device=ids.device)
    write_at = ((slot[:, None] * H + heads[None, :]) * L + pos[:, None]).reshape(-1)
    return Plan(ids, pos, write_at, [p[0] for p in parts], out_index)


class LayerWeights(NamedTuple):
    """One decoder layer's parameter tensors (the model's own: no copies)."""

    attn_norm: RMSNorm
    q: tuple[torch.Tensor, torch.Tensor | None]
    k: tuple[torch.Tensor, torch.Tensor | None]
    v: tuple[torch.Tensor, torch.Tensor | None]
    o: tuple[torch.Tensor, torch.Tensor | None]
    q_norm: RMSNorm | None
    k_norm: RMSNorm | None
    mlp_norm: RMSNorm
    gate: tuple[torch.Tensor, torch.Tensor | None]
    up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]


class Weights(NamedTuple):
    """References to a `CausalLM`'s parameters, gathered once: a decode step of a small model
    would otherwise spend a tenth of its time in `nn.Module.__getattr__`. Valid as long as the
    parameters are updated in place (an optimizer step, `Engine.load_weights`), not replaced."""

    cfg: ModelConfig
    embed: torch.Tensor
    inv_freq: torch.Tensor
    layers: list[LayerWeights]
    norm: RMSNorm
    lm_head: torch.Tensor


def model_weights(model: CausalLM) -> Weights:
    def lin(m: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
        return m.weight, m.bias

    layers = []
    for layer in model.model.layers:
        assert isinstance(layer, DecoderLayer)
        a, mlp = layer.self_attn, layer.mlp
        layers.append(
            LayerWeights(
                layer.input_layernorm,
                lin(a.q_proj),
                lin(a.k_proj),
                lin(a.v_proj),
                lin(a.o_proj),
                getattr(a, "q_norm", None),
                getattr(a, "k_norm", None),
                layer.post_attention_layernorm,
                lin(mlp.gate_proj),
                lin(mlp.up_proj),
                lin(mlp.down_proj),
            )
        )
    return Weights(
        model.config,
        model.model.embed_tokens.weight,
        cast(torch.Tensor, model.inv_freq),
        layers,
        model.model.norm,
        model.lm_head.weight,
    )


def _norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    # F.rms_norm is one fused op with the module's float32 arithmetic; other dtypes keep the
    # module's cast-to-float path
    if x.dtype == torch.float32:
        return F.rms_norm(x, norm.weight.shape, norm.weight, norm.eps)
    return norm(x)


@torch.no_grad()
def forward(w: Weights, cache: SlotKV, plan: Plan) -> torch.Tensor | None:
    """Write the plan's keys/values into the cache; logits `[M, V]` at `plan.out_index`."""
    cfg = w.cfg
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    assert hd is not None
    rep, N = nh // nkv, plan.ids.shape[0]
    freqs = plan.positions[:, None].float() * w.inv_freq  # [N, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    x = F.embedding(plan.ids, w.embed)
    # rotate_half(x) * sin == roll(x, hd/2) * (sin with its first half negated)
    sign = torch.ones(hd, dtype=x.dtype, device=x.device)
    sign[: hd // 2] = -1
    cos, sin = emb.cos().to(x.dtype)[:, None], (emb.sin().to(x.dtype) * sign)[:, None]
    masks = [p.mask if p.T == 1 or rep == 1 else p.mask.repeat(1, 1, rep, 1) for p in plan.parts]
    for i, lw in enumerate(w.layers):
        h = _norm(lw.attn_norm, x)
        q = F.linear(h, *lw.q).view(N, nh, hd)
        k = F.linear(h, *lw.k).view(N, nkv, hd)
        v = F.linear(h, *lw.v).view(N, nkv, hd)
        if lw.q_norm is not None and lw.k_norm is not None:
            q, k = _norm(lw.q_norm, q), _norm(lw.k_norm, k)
        q = torch.addcmul(q * cos, q.roll(hd // 2, -1), sin)
        k = torch.addcmul(k * cos, k.roll(hd // 2, -1), sin)
        ck_all, cv_all = cache.k[i], cache.v[i]
        cache.k_flat[i].index_copy_(0, plan.write_at, k.reshape(-1, hd).to(ck_all.dtype))
        cache.v_flat[i].index_copy_(0, plan.write_at, v.reshape(-1, hd).to(cv_all.dtype))
        outs, off = [], 0
        for part, mask in zip(plan.parts, masks):
            outs.append(_attend(part, mask, q[off : off + part.n_tokens], ck_all, cv_all, rep))
            off += part.n_tokens
        o = torch.cat(outs) if len(outs) > 1 else outs[0]
        x = x + F.linear(o, *lw.o)
        h = _norm(lw.mlp_norm, x)
        x = x + F.linear(F.silu(F.linear(h, *lw.gate)) * F.linear(h, *lw.up), *lw.down)
    if plan.out_index is None:
        return None
    x = x.index_select(0, plan.out_index)  # only the sampled positions reach the LM head
    return F.linear(_norm(w.norm, x), w.lm_head)


def _attend(
    part: Part, mask: torch.Tensor, q: torch.Tensor, ck: torch.Tensor, cv: torch.Tensor, rep: int
) -> torch.Tensor:
    """Attention of one part's queries `[n, nh, hd]` over its slots' cache; `[n, nh * hd]`."""
    _, nh, hd = q.shape
    nkv, R, T = nh // rep, part.rows, part.T
    ck, cv = ck[:, :, : part.span], cv[:, :, : part.span]
    if isinstance(part.slots, slice):
        ck, cv = ck[part.slots], cv[part.slots]
    else:
        ck, cv = ck.index_select(0, part.slots), cv.index_select(0, part.slots)
    if T == 1:
        qg = q.view(R, nkv, rep, hd)
    else:
        padded = q.new_zeros(R * T, nh, hd).index_copy_(0, part.pad_index, q)  # type: ignore[arg-type]
        qg = padded.view(R, T, nkv, rep, hd).permute(0, 2, 3, 1, 4).reshape(R, nkv, rep * T, hd)
    out = F.scaled_dot_product_attention(qg, ck.to(q.dtype), cv.to(q.dtype), attn_mask=mask)
    if T == 1:
        return out.reshape(R, nh * hd)
    out = out.view(R, nkv, rep, T, hd).permute(0, 3, 1, 2, 4).reshape(R * T, nh * hd)
    return out.index_select(0, part.pad_index)  # type: ignore[arg-type]
