"""The model's weights laid out for generation: fused, transposed copies kept in step with the model.

A decode step of a small model is a few dozen small matrix products per layer, and each pays
its own dispatch and its own pass over the activations. Packing cuts that:

- q, k and v are one `[hidden, q + 2 kv]` matrix and gate and up one `[hidden, 2 inter]`, so a
  layer runs four products instead of seven;
- every matrix is stored transposed, `[in, out]` row-major, so a product is `torch.mm` /
  `torch.addmm` on two row-major operands (on CPU, MKL's fastest case: about 25% faster than
  `F.linear` on the `[out, in]` layout at decode sizes, measured in bench/engine.py);
- the residual adds are folded into the output products (`addmm(x, o, W_o)`);
- cos/sin of every position up to `max_len` are tabulated once: a step looks them up.

The packed matrices are copies (they cost the weights' memory once more), so they must follow
the model. `sync()` refreshes them when any parameter's in-place version counter has moved
since the last refresh: an optimizer step, `copy_` under `no_grad` (`Engine.load_weights`),
`load_state_dict`. Writes that bypass the counter (through `.data`, or `AdamW(fused=True)`,
whose kernel does not bump it) are not seen; `mark_stale()` forces the next `sync()` to
refresh, and the engine calls it whenever its `version` changes, which is how the schedules
announce a new policy on a shared model.
"""

from __future__ import annotations

from typing import NamedTuple, cast

import torch
from torch import nn

from slipstream.model.llama import CausalLM, DecoderLayer, RMSNorm


class PackedLayer(NamedTuple):
    """One decoder layer. Matrices `[in, out]`; biases `[out]` or None; norms the model's own."""

    attn_norm: RMSNorm
    qkv: torch.Tensor  # [hidden, (heads + 2 kv_heads) * head_dim]
    qkv_bias: torch.Tensor | None
    q_norm: RMSNorm | None
    k_norm: RMSNorm | None
    o: torch.Tensor  # [heads * head_dim, hidden]
    o_bias: torch.Tensor | None
    mlp_norm: RMSNorm
    gate_up: torch.Tensor  # [hidden, 2 * intermediate]: gate columns, then up columns
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor  # [intermediate, hidden]
    down_bias: torch.Tensor | None


def _pairs(layer: DecoderLayer) -> list[tuple[list[nn.Linear], str]]:
    """Which linear layers fuse into which packed matrix, in column order."""
    a, m = layer.self_attn, layer.mlp
    return [
        ([a.q_proj, a.k_proj, a.v_proj], "qkv"),
        ([a.o_proj], "o"),
        ([m.gate_proj, m.up_proj], "gate_up"),
        ([m.down_proj], "down"),
    ]


class PackedWeights:
    """Packed copies of a `CausalLM`'s matrices plus rope tables for positions `< max_len`."""

    def __init__(self, model: CausalLM, max_len: int) -> None:
        self.cfg = model.config
        self._model = model
        self._params = list(model.parameters())
        self.embed = model.model.embed_tokens.weight  # read by reference: a lookup, no product
        self.norm = model.model.norm
        p = model.lm_head.weight
        self.lm_head = torch.empty(p.shape[1], p.shape[0], dtype=p.dtype, device=p.device)
        self.layers: list[PackedLayer] = []
        for layer in model.model.layers:
            assert isinstance(layer, DecoderLayer)
            mats: dict[str, torch.Tensor | None] = {}
            for lins, name in _pairs(layer):
                w = lins[0].weight
                out = sum(lin.out_features for lin in lins)
                mats[name] = torch.empty(w.shape[1], out, dtype=w.dtype, device=w.device)
                has_bias = lins[0].bias is not None
                mats[name + "_bias"] = w.new_empty(out) if has_bias else None
            a = layer.self_attn
            self.layers.append(
                PackedLayer(
                    attn_norm=layer.input_layernorm,
                    q_norm=cast(RMSNorm | None, getattr(a, "q_norm", None)),
                    k_norm=cast(RMSNorm | None, getattr(a, "k_norm", None)),
                    mlp_norm=layer.post_attention_layernorm,
                    **mats,  # type: ignore[arg-type]
                )
            )
        self.cos, self.sin = _rope_tables(model.inv_freq, max_len, p.dtype)
        self._stamp = -1
        self.sync()

    def _version_sum(self) -> int:
        return sum(p._version for p in self._params)

    def mark_stale(self) -> None:
        """Make the next `sync()` refresh whatever the version counters say."""
        self._stamp = -1

    @torch.no_grad()
    def sync(self) -> bool:
        """Refresh the copies if the model's parameters changed in place; True if it did."""
        stamp = self._version_sum()
        if stamp == self._stamp:
            return False
        self.lm_head.copy_(self._model.lm_head.weight.t())
        for packed, layer in zip(self.layers, self._model.model.layers):
            assert isinstance(layer, DecoderLayer)
            for lins, name in _pairs(layer):
                mat, bias, col = getattr(packed, name), getattr(packed, name + "_bias"), 0
                for lin in lins:
                    n = lin.out_features
                    mat[:, col : col + n].copy_(lin.weight.t())
                    if bias is not None:
                        bias[col : col + n].copy_(lin.bias)
                    col += n
        self._stamp = stamp
        return True


def _rope_tables(
    inv_freq: torch.Tensor, max_len: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin `[max_len, head_dim]`, element for element the model's arithmetic.

    rotate_half(x) * sin == roll(x, head_dim / 2) * (sin with its first half negated).
    """
    pos = torch.arange(max_len, device=inv_freq.device)
    freqs = pos[:, None].float() * inv_freq  # as CausalLM.forward: positions.float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    half = emb.shape[-1] // 2
    sign = torch.ones(emb.shape[-1], dtype=dtype, device=emb.device)
    sign[:half] = -1
    return emb.cos().to(dtype), emb.sin().to(dtype) * sign
