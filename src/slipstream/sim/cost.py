"""First-principles cost model: seconds for decode, prefill, training and weight sync.

Pure functions of a `ModelShape`, a `Hardware` and sizes. Units: seconds, bytes, FLOPs, tokens.

Decode (one step of one sampler engine over `tp` devices, batch of `n` sequences whose
contexts add up to `ctx` tokens) is the slower of its two costs, plus a fixed overhead:

    flop_s  = (2 * active_params * n + 4 * layers * q_dim * ctx) / (tp * peak * flop_eff)
    bytes_s = (weight_bytes + kv_bytes_per_token * ctx)            / (tp * hbm  * bw_eff)
    step_s  = overhead + max(flop_s, bytes_s)

Every weight is read once per step whatever the batch, so at small batch a step costs about
the same as at batch 32: this is why a straggler tail leaves a sampler nearly idle while it
still takes the full step time. Each decode step adds one token per sequence, so `ctx` grows by
`n` per step and both costs are linear in the step index between two changes of the batch;
`DecodeModel.time_for_steps` sums them in closed form, which is what makes the simulator fast.

Prefill is compute bound: 2 x active_params FLOPs per prompt token plus causal attention.
Training is 6 x active_params FLOPs per token (forward + backward, Kaplan et al. 2020) plus
attention, at the hardware's MFU. Weight sync moves `weight_bytes` over the interconnect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from slipstream.sim.hardware import Hardware


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder that set its cost. Counts are plain numbers, not billions."""

    name: str
    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    vocab: int
    active_params: float | None = None
    """Parameters used per token (mixture of experts); `params` when dense."""
    q_dim: int | None = None
    """Query heads x head_dim; `hidden` when not given."""
    bytes_per_param: float = 2.0
    kv_bytes_per_elem: float = 2.0

    @property
    def active(self) -> float:
        return self.active_params if self.active_params is not None else self.params

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """Bytes of K and V cache one token keeps, across all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_elem

    @property
    def attn_flops_per_ctx_token(self) -> float:
        """Decode FLOPs per (new token, context token) pair: QK^T and AV, all layers."""
        return 4 * self.layers * (self.q_dim or self.hidden)

    @classmethod
    def from_info(cls, info: dict[str, float], name: str = "run") -> ModelShape:
        """From a run folder's `model_info.json` (params, layers, hidden, kv_heads, ...).

        Weights and KV cache take `bytes_per_param` bytes an element: what the run recorded
        (its parameters' element size, `CausalLM.info`: 4 on the CPU, which runs in float32).
        A model_info.json written before runs recorded it lacks the key and gets 2.0, the
        width the recorded runs in tests/data were calibrated with (the figures in the docs),
        although their parameters were float32, so that they keep their figures.
        """
        keys = ("params", "layers", "hidden", "kv_heads", "head_dim", "vocab")
        missing = [k for k in keys if k not in info]
        if missing:
            raise ValueError(f"model_info lacks {', '.join(missing)}")
        width = float(info.get("bytes_per_param", 2.0))
        layers, hidden, kv_heads, head_dim, vocab = (int(info[k]) for k in keys[1:])
        return cls(
            name,
            float(info["params"]),
            layers,
            hidden,
            kv_heads,
            head_dim,
            vocab,
            bytes_per_param=width,
            kv_bytes_per_elem=width,
        )


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("qwen2.5-0.5b", 0.49e9, 24, 896, 2, 64, 151936),
        ModelShape("qwen2.5-1.5b", 1.54e9, 28, 1536, 2, 128, 151936),
        ModelShape("qwen2.5-7b", 7.6e9, 28, 3584, 4, 128, 152064),
        ModelShape("llama-3.1-8b", 8.0e9, 32, 4096, 8, 128, 128256),
        ModelShape("qwen2.5-32b", 32.8e9, 64, 5120, 8, 128, 152064),
        ModelShape("qwen3-30b-a3b", 30.5e9, 48, 2048, 4, 128, 151936, 3.3e9, 4096),
    )
}
MODEL_ALIASES = {"0.5b": "qwen2.5-0.5b", "1.5b": "qwen2.5-1.5b", "7b": "qwen2.5-7b"}
MODEL_ALIASES |= {"8b": "llama-3.1-8b", "32b": "qwen2.5-32b", "30b-a3b": "qwen3-30b-a3b"}


def model_shape(name: str) -> ModelShape:
    """The preset called `name` (or a short alias such as `7b`)."""
    key = MODEL_ALIASES.get(name.lower(), name.lower())
    if key not in MODELS:
        valid = ", ".join([*MODELS, *MODEL_ALIASES])
        raise ValueError(f"unknown model {name!r}; valid: {valid}")
    return MODELS[key]


@dataclass(frozen=True)
class DecodeModel:
    """Decode step time of one engine as linear pieces, for closed-form sums over steps.

    `step_time(n, ctx) = overhead + max(flop_seq*n + flop_ctx*ctx, weights + kv*ctx)`, seconds.
    """

    overhead: float
    flop_seq: float
    flop_ctx: float
    weights: float
    kv: float

    @classmethod
    def build(cls, model: ModelShape, hw: Hardware, tp: int = 1) -> DecodeModel:
        if hw.decode_seq_s is not None:  # a measured line (calibrated CPU profile)
            return cls(
                hw.decode_overhead_s, hw.decode_seq_s / tp, (hw.decode_ctx_s or 0.0) / tp, 0.0, 0.0
            )
        flops = tp * hw.peak_flops * hw.decode_flop_eff
        bw = tp * hw.hbm_bandwidth * hw.decode_bw_eff
        return cls(
            hw.decode_overhead_s,
            2 * model.active / flops,
            model.attn_flops_per_ctx_token / flops,
            model.weight_bytes / bw,
            model.kv_bytes_per_token / bw,
        )

    def step_time(self, n: int, ctx: float) -> float:
        """Seconds for one decode step of `n` sequences holding `ctx` context tokens."""
        return self.overhead + max(
            self.flop_seq * n + self.flop_ctx * ctx, self.weights + self.kv * ctx
        )

    def time_for_steps(self, n: int, ctx: float, k: int) -> float:
        """Seconds for `k` decode steps of `n` sequences starting at `ctx` (grows by n a step)."""
        if k <= 0:
            return 0.0
        a1, b1 = self.flop_seq * n + self.flop_ctx * ctx, self.flop_ctx * n
        a2, b2 = self.weights + self.kv * ctx, self.kv * n
        # two lines cross at most once: one above the other at both ends is above throughout
        # (the common case, and the simulator's hottest call: no root to find)
        last = k - 1
        if a1 >= a2 and a1 + b1 * last >= a2 + b2 * last:
            return k * self.overhead + k * a1 + b1 * (k * last / 2)
        if a2 >= a1 and a2 + b2 * last >= a1 + b1 * last:
            return k * self.overhead + k * a2 + b2 * (k * last / 2)
        return k * self.overhead + sum_max_linear(a1, b1, a2, b2, k)

    def steps_within(self, n: int, ctx: float, dt: float, kmax: int) -> int:
        """Fewest steps (<= kmax) whose total time reaches `dt`: the step running at `dt`
        counts as done, since a change (new weights, abort) lands between two steps."""
        if dt <= 0:
            return 0
        lo, hi = 0, kmax
        while lo < hi:
            mid = (lo + hi) // 2
            if self.time_for_steps(n, ctx, mid) >= dt:
                hi = mid
            else:
                lo = mid + 1
        return lo


def sum_max_linear(a1: float, b1: float, a2: float, b2: float, k: int) -> float:
    """Sum over x = 0..k-1 of max(a1 + b1*x, a2 + b2*x), exactly.

    max(l1, l2) = l2 + max(l1 - l2, 0); the difference is linear, so it is positive on one
    interval of x, found from its root.
    """
    total = k * a2 + b2 * k * (k - 1) / 2
    da, db = a1 - a2, b1 - b2
    if db == 0:
        return total + k * max(da, 0.0)
    # the root, clamped to [-1, k] (a tiny slope sends it out of range, even to infinity):
    # where it lies outside 0..k-1 only which side matters
    root = min(max(-da / db, -1.0), float(k))
    if db > 0:  # positive for x > root
        lo = max(0, math.floor(root) + 1)
        hi = k - 1
    else:  # positive for x < root
        lo = 0
        hi = min(k - 1, math.ceil(root) - 1)
    if hi < lo:
        return total
    count = hi - lo + 1
    return total + count * da + db * (lo + hi) * count / 2


def prefill_time(model: ModelShape, hw: Hardware, tokens: float, tp: int = 1) -> float:
    """Seconds to prefill one prompt of `tokens` tokens (compute bound, causal attention)."""
    if hw.prefill_token_s is not None:
        # measured on the local engine, whose mixed step prefills admitted prompts in the same
        # forward as the decode step: no pass of its own (the simulator counts a sequence's
        # passes from its first token), and the prompt's last row is the one that samples
        # that first token, which the decode line already charges
        ctx_s = (hw.decode_ctx_s or 0.0) * tokens * tokens / 2
        return (hw.prefill_token_s * max(tokens - 1, 0.0) + ctx_s) / tp
    flops = 2 * model.active * tokens + model.attn_flops_per_ctx_token * tokens * tokens / 2
    return flops / (tp * hw.peak_flops * hw.prefill_flop_eff)


def train_time(
    model: ModelShape, hw: Hardware, tokens: float, n_gpus: int, mean_context: float = 0.0
) -> float:
    """Seconds for one optimizer step over `tokens` tokens on `n_gpus` devices.

    6 x active_params FLOPs per token, plus 3x the forward attention at `mean_context`
    (the average causal context, about half the sequence length), at `hw.mfu`.
    """
    if hw.train_token_s is not None:
        return hw.train_overhead_s + hw.train_token_s * tokens / n_gpus
    per_token = 6 * model.active + 3 * model.attn_flops_per_ctx_token * mean_context
    return hw.train_overhead_s + per_token * tokens / (n_gpus * hw.peak_flops * hw.mfu)


def weight_sync_time(model: ModelShape, hw: Hardware, colocated: bool = False) -> float:
    """Seconds to move new weights to a sampler: bytes / bandwidth + a fixed latency.

    Disaggregated pools broadcast over the interconnect (NCCL pipelines a broadcast, so the
    time does not grow with the number of samplers); colocated ones reshard over NVLink.
    """
    bandwidth = hw.local_bandwidth if colocated else hw.interconnect_bandwidth
    return hw.sync_latency_s + model.weight_bytes / bandwidth


def sampler_tp(model: ModelShape, hw: Hardware) -> int:
    """Fewest devices (1, 2, 4, 8) per engine so that weights take at most half the memory
    an engine may use, leaving the rest for KV cache."""
    for tp in (1, 2, 4, 8):
        if model.weight_bytes <= 0.5 * tp * hw.memory_bytes * hw.memory_util:
            return tp
    raise ValueError(f"{model.name} does not fit on 8 x {hw.name}")


def kv_capacity_tokens(model: ModelShape, hw: Hardware, tp: int) -> float:
    """Tokens of KV cache one engine of `tp` devices holds (after weights, 5 % activations)."""
    free = tp * hw.memory_bytes * (hw.memory_util - 0.05) - model.weight_bytes
    if free <= 0:
        raise ValueError(f"{model.name} leaves no KV cache room on {tp} x {hw.name}")
    return free / model.kv_bytes_per_token


def engine_slots(model: ModelShape, hw: Hardware, tp: int, tokens_per_seq: float) -> int:
    """Sequences one engine decodes at once: KV cache / tokens a sequence holds on average,
    capped by `hw.max_num_seqs`."""
    fit = int(kv_capacity_tokens(model, hw, tp) // max(tokens_per_seq, 1.0))
    return max(1, min(hw.max_num_seqs, fit))


def min_trainer_gpus(model: ModelShape, hw: Hardware) -> int:
    """Fewest devices that hold training state: 16 bytes a parameter (bf16 weights and
    gradients, fp32 master weights and two Adam moments), sharded, in 80 % of memory."""
    return max(1, math.ceil(16 * model.params / (0.8 * hw.memory_bytes)))


def cost_per_million_tokens(
    price_per_hour: float, n_devices: float, wall_s: float, tokens: float
) -> float:
    """Dollars per million trained tokens: devices x price x hours / (tokens / 1e6)."""
    if tokens <= 0:
        return math.inf
    return n_devices * price_per_hour * wall_s / 3600 / (tokens / 1e6)


def sum_max_linear_np(
    a1: np.ndarray, b1: np.ndarray, a2: np.ndarray, b2: np.ndarray, k: np.ndarray
) -> np.ndarray:
    """`sum_max_linear` elementwise over arrays (same formula, vectorised)."""
    k = k.astype(np.float64)
    total = k * a2 + b2 * k * (k - 1) / 2
    da, db = a1 - a2, b1 - b2
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        root = np.where(db != 0, -da / np.where(db != 0, db, 1.0), 0.0)
    root = np.clip(root, -1.0, k)  # as in sum_max_linear: only the side matters out of range
    lo = np.where(db > 0, np.maximum(0.0, np.floor(root) + 1), 0.0)
    hi = np.where(db > 0, k - 1, np.minimum(k - 1, np.ceil(root) - 1))
    count = np.where(db == 0, np.where(da > 0, k, 0.0), np.maximum(hi - lo + 1, 0.0))
    lo = np.where(db == 0, 0.0, lo)
    return total + count * da + db * (2 * lo + count - 1) * count / 2
