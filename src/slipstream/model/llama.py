"""A Llama-family decoder in plain PyTorch: Llama, Qwen2/Qwen2.5 and Qwen3.

RMSNorm, rotary embeddings (rope_theta, optional Llama-3 frequency scaling), SwiGLU MLP,
grouped-query attention, optional tied embeddings, Qwen2-style q/k/v bias and Qwen3-style
per-head q/k RMSNorm. Module and parameter names mirror Hugging Face's, so a checkpoint's
state dict loads with no renaming.

One attention path serves training and generation. Without a cache it is plain causal
attention over the batch. With a `KVCache` it writes the new keys/values into the slots
given, at the positions given, and attends over each slot's cache up to each query's
position: prefill of a right-padded batch and one decode step of a ragged batch are the
same call. Continuous batching (engine/) relies on exactly that.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def rope_type(scaling: dict[str, Any] | None) -> str:
    """The type a config.json's rotary settings name, as transformers reads it: `rope_type`,
    else the older `type`, else `default`."""
    scaling = scaling or {}
    return scaling.get("rope_type", scaling.get("type")) or "default"


def rope_kind(scaling: dict[str, Any] | None) -> str:
    """`default` or `llama3`, the rope scalings implemented; anything else raises ValueError,
    as does a llama3 scaling without a band between its frequency factors."""
    scaling = scaling or {}
    kind = rope_type(scaling)
    if kind not in ("default", "llama3"):
        raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: default, llama3")
    # transformers refuses a llama3 scaling without these (a KeyError when it reads the config);
    # only original_max_position_embeddings has a default there (max_position_embeddings)
    for key in ("factor", "low_freq_factor", "high_freq_factor") if kind == "llama3" else ():
        if not isinstance(scaling.get(key), int | float):
            raise ValueError(f"rope_scaling: llama3 scaling needs a numeric {key!r}")
    # high_freq_factor at or below low_freq_factor leaves no smoothing band between them, and
    # its slope divides by zero or flips sign: not a llama3 scaling (transformers only warns)
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise ValueError(
            "rope_scaling: llama3 scaling needs high_freq_factor > low_freq_factor, got "
            f"high_freq_factor = {scaling['high_freq_factor']!r} and "
            f"low_freq_factor = {scaling['low_freq_factor']!r}"
        )
    return kind


def check_rotary_fraction(extra: dict[str, Any], scaling: dict[str, Any] | None) -> None:
    """A ValueError unless config.json's `partial_rotary_factor` (top level, or in its rotary
    settings `scaling` or `rope_parameters`) is absent or 1.0. Below 1, the implementations
    disagree on the model: transformers' Llama/Qwen2/Qwen3 rotate the whole head regardless
    (or fail, with a llama3 scaling), vLLM's rotate that fraction of it."""
    rope = extra.get("rope_parameters")
    for where in (extra, scaling or {}, rope if isinstance(rope, dict) else {}):
        value = where.get("partial_rotary_factor")
        if value is not None and value != 1.0:
            raise ValueError(
                f"partial_rotary_factor {value!r} is not supported (only 1.0: rotary "
                "embeddings over the whole head)"
            )


def sliding_window(extra: dict[str, Any], num_layers: int) -> int | None:
    """The attention window of a Qwen2/Qwen3 config.json (`extra`: its other keys) when some
    layer has one, else None. As transformers reads it: `sliding_window` counts only with
    `use_sliding_window`, on the layers `layer_types` marks `sliding_attention`, or else on
    layers `max_window_layers` and above (default 28). A query then sees its last
    `sliding_window` keys only, so a sequence of at most that many tokens is unaffected; this
    decoder attends to the whole sequence, so longer ones would differ."""
    window = window_setting(extra)
    if window is None:
        return None
    types = extra.get("layer_types")
    if isinstance(types, list):
        windowed = "sliding_attention" in types[:num_layers]
    else:
        first = extra.get("max_window_layers", 28)
        windowed = isinstance(first, int) and first < num_layers
    return window if windowed else None


def window_setting(extra: dict[str, Any]) -> int | None:
    """A Qwen2/Qwen3 config.json's `sliding_window` as transformers keeps it: None unless
    `use_sliding_window` (left out, the window is its default 4096)."""
    window = extra.get("sliding_window", 4096)
    return window if extra.get("use_sliding_window") and isinstance(window, int) else None


def check_layer_types(model_type: str, extra: dict[str, Any], num_layers: int) -> None:
    """A ValueError naming the fields when a Qwen2/Qwen3 config.json's `layer_types` marks a
    layer `sliding_attention` that has no window (`use_sliding_window` false, or a null
    `sliding_window`). transformers reads no window there and fails on every forward pass of
    such a model (it cannot build that layer's mask or cache); full attention would be a
    model of slipstream's own making."""
    types = extra.get("layer_types")
    if model_type == "llama" or not isinstance(types, list):
        return  # transformers' Llama has no layer types
    if "sliding_attention" not in types[:num_layers] or window_setting(extra) is not None:
        return
    why = (
        "use_sliding_window is false"
        if not extra.get("use_sliding_window")
        else f"sliding_window is {json.dumps(extra.get('sliding_window'))}"
    )
    raise ValueError(
        f"layer_types marks layers 'sliding_attention' but {why}, so they have no window "
        "(transformers fails on such a model): mark them 'full_attention', or set "
        "use_sliding_window and a sliding_window"
    )


def window_error(
    cfg: ModelConfig, max_len: int, setting: str, advice: str | None = None
) -> str | None:
    """One line when `cfg`'s sliding window (`sliding_window`) could change sequences of
    `max_len` tokens, which this decoder does not implement; None when it cannot matter.
    `advice`: how to bring the length down (None: engine.max_len). A Llama config's window
    settings are none: transformers' Llama attends to the whole sequence whatever they say."""
    if cfg.model_type == "llama":
        return None
    window = sliding_window(cfg.extra, cfg.num_hidden_layers)
    if window is None or max_len <= window:
        return None
    return (
        f"config.json: use_sliding_window with sliding_window = {window} is not implemented "
        f"(full attention on every layer), and the run's sequences reach {max_len} tokens "
        f"({setting}); at most {window} tokens it cannot matter: "
        + (advice or f"set engine.max_len <= {window}")
    )


@dataclass
class ModelConfig:
    """The shape of a decoder; field names follow Hugging Face's config.json."""

    model_type: str = "llama"
    vocab_size: int = 32
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v (and for Llama and Qwen3 o) projections
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # other keys, written back on save

    def __post_init__(self) -> None:
        if self.model_type not in ARCHITECTURES:
            raise ValueError(
                f"unsupported model_type {self.model_type!r}; supported: {', '.join(ARCHITECTURES)}"
            )
        sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
        for name in (*sizes, "vocab_size", "intermediate_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        act = self.extra.get("hidden_act", "silu")
        if act not in ("silu", "swish"):  # transformers' names of one function (SwiGLU's)
            raise ValueError(f"hidden_act {act!r} is not supported (only 'silu', 'swish')")
        if self.extra.get("quantization_config") is not None:  # GPTQ, AWQ, FP8... weights
            method = self.extra["quantization_config"]
            method = method.get("quant_method", "?") if isinstance(method, dict) else method
            raise ValueError(
                f"quantized checkpoints are not supported (quantization_config: {method!r}); "
                "give the model's unquantized weights"
            )
        rope_kind(self.rope_scaling)  # an unsupported scaling fails here, at the config check
        check_rotary_fraction(self.extra, self.rope_scaling)
        check_layer_types(self.model_type, self.extra, self.num_hidden_layers)

    @property
    def qkv_bias(self) -> bool:
        return self.model_type == "qwen2" or self.attention_bias

    @property
    def o_bias(self) -> bool:  # Llama's and Qwen3's `attention_bias` covers o_proj; Qwen2 has none
        return self.model_type in ("llama", "qwen3") and self.attention_bias

    @property
    def mlp_proj_bias(self) -> bool:  # Llama's `mlp_bias`; Qwen2's and Qwen3's MLPs have none
        return self.model_type == "llama" and self.mlp_bias

    @property
    def qk_norm(self) -> bool:
        return self.model_type == "qwen3"

    @property
    def padding_idx(self) -> int | None:
        """The embedding row of `pad_token_id` when it names one, else None. transformers'
        Llama/Qwen2/Qwen3 build their embedding with it as `padding_idx`: the lookup gives that
        row no gradient (a tied LM head still does)."""
        pad = self.pad_token_id
        valid = isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < self.vocab_size
        return pad if valid else None

    def num_params(self) -> int:
        h, i, n = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        q = self.num_attention_heads * self.head_dim  # type: ignore[operator]
        kv = self.num_key_value_heads * self.head_dim  # type: ignore[operator]
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return n * per_layer + emb + h


class KVCache:
    """Keys and values for a fixed pool of sequence slots: `[layers][S, L, kv_heads, head_dim]`."""

    def __init__(
        self, cfg: ModelConfig, num_slots: int, max_len: int, dtype: torch.dtype, device: Any = None
    ) -> None:
        assert cfg.head_dim is not None  # set by ModelConfig.__post_init__
        shape = (num_slots, max_len, cfg.num_key_value_heads, cfg.head_dim)
        self.k = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)
        ]
        self.v = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)
        ]
        self.num_slots = num_slots
        self.max_len = max_len


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies `[head_dim/2]`, with Llama-3 scaling when the config asks for it.

    Computed as transformers computes them, in float32 step for step, so that they are its
    frequencies to the bit (in float64 they differed in the last bit of some: at long
    positions, rotary angles apart by up to position * 6e-8 radians)."""
    dim = cfg.head_dim
    assert dim is not None  # set by ModelConfig.__post_init__
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    scaling = cfg.rope_scaling or {}
    if rope_kind(scaling) == "default":
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    # left out, transformers takes the model's own context as the one trained
    old_ctx = scaling.get("original_max_position_embeddings", cfg.max_position_embeddings)
    wavelen = 2 * math.pi / inv
    low_wl, high_wl = old_ctx / low, old_ctx / high
    scaled = torch.where(wavelen > low_wl, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    mid = (wavelen >= high_wl) & (wavelen <= low_wl)
    return torch.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        assert hd is not None
        self.layer, self.hd, self.nh, self.nkv = layer, hd, nh, nkv
        self.q_proj = nn.Linear(cfg.hidden_size, nh * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, nkv * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, nkv * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(nh * hd, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache | None,
        slots: torch.Tensor | None,
        doc_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`doc_mask [B, 1, T, T]` (no cache): which keys each query sees, for packed rows."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        # cos/sin: [B, T, hd] -> broadcast over heads
        q = q * cos[:, :, None] + rotate_half(q) * sin[:, :, None]
        k = k * cos[:, :, None] + rotate_half(k) * sin[:, :, None]
        q = q.transpose(1, 2)  # [B, nh, T, hd]
        if cache is None:
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            mask = doc_mask
            causal = doc_mask is None
        else:
            assert slots is not None
            ck, cv = cache.k[self.layer], cache.v[self.layer]
            rows = slots[:, None].expand(B, T)
            ck.index_put_((rows, positions), k.to(ck.dtype))
            cv.index_put_((rows, positions), v.to(cv.dtype))
            span = int(positions.max()) + 1
            k = ck[slots, :span].transpose(1, 2).to(q.dtype)  # [B, nkv, span, hd]
            v = cv[slots, :span].transpose(1, 2).to(q.dtype)
            # each query sees its slot's cache up to its own position
            mask = (
                torch.arange(span, device=x.device)[None, None, None, :]
                <= positions[:, None, :, None]
            )
            causal = False
        if self.nkv != self.nh:
            rep = self.nh // self.nkv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, i, b = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_proj_bias
        self.gate_proj = nn.Linear(h, i, bias=b)
        self.up_proj = nn.Linear(h, i, bias=b)
        self.down_proj = nn.Linear(i, h, bias=b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, positions, cache, slots, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, cache, slots, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # nn.Embedding's own init, but none on the meta device (where models are built to be
        # loaded): the first normal_ there costs about a second a process (it imports torch's
        # Python reference kernels, torch._dynamo among them)
        weight = torch.empty(cfg.vocab_size, cfg.hidden_size)
        if not weight.is_meta:
            nn.init.normal_(weight)
        self.embed_tokens = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.padding_idx, _weight=weight
        )
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """Decoder with an LM head. `forward(input_ids [B, T]) -> logits [B, T, V]`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.inv_freq: torch.Tensor
        # computed, never loaded; on the meta device left empty, as the embedding's init (the
        # callers compute it on the model's device)
        assert cfg.head_dim is not None  # set by ModelConfig.__post_init__
        meta = self.lm_head.weight.is_meta
        inv = torch.empty(cfg.head_dim // 2) if meta else rope_inv_freq(cfg)
        self.register_buffer("inv_freq", inv, persistent=False)
        self.activation_checkpointing = False  # see `hidden`

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits `[B, T, V]`.

        Without `cache`: causal attention over `input_ids`, positions 0..T-1 (right padding
        never affects earlier positions). With `cache`: `slots [B]` picks each row's cache slot
        and `positions [B, T]` where its tokens go; each token attends to its slot's cache
        up to its own position.
        """
        return self.lm_head(self.hidden(input_ids, positions, cache, slots))

    def hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        slots: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final hidden states `[B, T, hidden]` (after the last norm), before the LM head.

        The trainer scores only completion positions, in chunks (train.logprobs), so it never
        needs the `[B, T, V]` logits of `forward`. `doc_ids [B, T]` (no cache): several
        sequences packed into one row, each attending only within itself (positions then
        restart per sequence). With `activation_checkpointing` set and gradients on, each
        layer's activations are recomputed in the backward pass instead of kept (Chen et al.
        2016): memory per layer falls to its input, for about one more forward.
        """
        B, T = input_ids.shape
        if positions is None:
            positions = torch.arange(T, device=input_ids.device).expand(B, T)
        freqs = positions[..., None].float() * self.inv_freq  # [B, T, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        x = self.model.embed_tokens(input_ids)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        mask = None
        if doc_ids is not None:
            assert cache is None, "packed rows are a training input, never cached"
            same = doc_ids[:, :, None] == doc_ids[:, None, :]
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            mask = (same & causal)[:, None]  # [B, 1, T, T]
        ckpt = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.model.layers:
            if ckpt:
                x = checkpoint(
                    layer, x, cos, sin, positions, cache, slots, mask, use_reentrant=False
                )
            else:
                x = layer(x, cos, sin, positions, cache, slots, mask)
        return self.model.norm(x)

    def new_cache(self, num_slots: int, max_len: int) -> KVCache:
        p = self.lm_head.weight
        return KVCache(self.config, num_slots, max_len, p.dtype, p.device)

    def info(self) -> dict[str, int]:
        """The shape a run folder's `model_info.json` records for the simulator
        (`sim.cost.ModelShape.from_info`); `bytes_per_param` is the parameters' element size
        (4 in float32), which the weights and the KV cache (`new_cache`) take."""
        c = self.config
        assert c.head_dim is not None  # set by ModelConfig.__post_init__
        return {
            "params": c.num_params(),
            "layers": c.num_hidden_layers,
            "hidden": c.hidden_size,
            "kv_heads": c.num_key_value_heads,
            "head_dim": c.head_dim,
            "vocab": c.vocab_size,
            "bytes_per_param": self.lm_head.weight.element_size(),
        }
