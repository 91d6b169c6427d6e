"""How many tokens, sequences and how long a sequence the engine's KV cache may hold.

The KV cache is `[slots, max_len]` per layer (engine.forward.SlotKV). Its size follows from
the memory the engine is given, never the other way round: `engine.max_tokens` tokens, or
`engine.memory_fraction` of the engine's share of the device's free memory once the model is
on it (the whole of it, or the engine's part of a shared GPU: runtime.placement.memory_share),
less the engine's packed copy of the weights (engine.packed, built at the first step, after
the cache is sized: `packed_bytes`) and a sampler's staging copy (`memory_budget`). That
budget pays
for the cache, a row of `max_len` tokens per slot plus the cache's scratch row, and for the
outputs the decode step's CUDA graphs keep for the engine's life (the logits of every span
bucket, `graph_bytes`), so a high fraction leaves the graphs room when they are captured; the
slots are what it holds (at most the slots asked for: `engine_slots`).
A prompt that cannot fit `max_len` with its completion is skipped before generation and
counted, never an error in the middle of a run.
"""

from __future__ import annotations

import torch

from slipstream.engine.forward import span_buckets
from slipstream.model.llama import ModelConfig


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of one token's keys and values over all layers:
    2 x layers x kv_heads x head_dim x itemsize (Qwen2.5-1.5B, bf16: 2 x 28 x 2 x 128 x 2 =
    28 KiB)."""
    assert cfg.head_dim is not None
    item = dtype.itemsize
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * item


def packed_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of the engine's packed weights (engine.packed.PackedWeights): a transposed copy
    of the LM head and of every layer's q/k/v, o, gate/up and down matrices with their biases
    (the embedding and the norms are read by reference). About the model's size again:
    Qwen2.5-1.5B in bf16 (tied embedding: the head is copied all the same), 3.1 GB."""
    assert cfg.head_dim is not None
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    qkv = h * (q + 2 * kv) + (q + 2 * kv) * cfg.qkv_bias
    o = q * h + h * cfg.o_bias
    mlp = 3 * h * i + (2 * i + h) * cfg.mlp_proj_bias
    item = dtype.itemsize
    return (h * cfg.vocab_size + cfg.num_hidden_layers * (qkv + o + mlp)) * item


def graph_bytes(slots: int, vocab: int, dtype: torch.dtype, buckets: int) -> int:
    """Bytes the CUDA graphs of the decode step keep as outputs, which every replay rewrites
    and which stay allocated for the engine's life: per span bucket (`forward.span_buckets`),
    the decode graph's logits `[slots, vocab]` in the engine's `dtype` and its sampling graph's
    tokens (int64) and log-probs (float32) `[slots]`:
    buckets x slots x (vocab x itemsize + 8 + 4). Qwen2.5's 151,936 entries at 256 slots in
    bfloat16: 77.8 MB a bucket, 700 MB over the nine buckets of `max_len` 4096 (twice that
    for the in-process engine's float32)."""
    item = dtype.itemsize
    return buckets * slots * (vocab * item + 8 + 4)


def memory_budget(
    free_bytes: int, memory_fraction: float, own_bytes: int, share: float = 1.0
) -> int:
    """The bytes an engine's KV cache and graph outputs may take: `memory_fraction` of its
    `share` of the free memory (runtime.placement.memory_share: 1 / n for the n engines of a
    local run on one GPU, the GPU fraction a Ray actor asked for) less `own_bytes`, what the
    engine allocates beside them (its packed weights, `packed_bytes`, and a sampler process's
    staging copy of the weights, which its first weight read allocates). Each engine's own
    copies come out of its share, so the engines sharing a GPU, measuring the same free
    memory, allocate at most that memory together. 0 when its copies alone fill its share."""
    return int(memory_fraction * max(0, int(share * free_bytes) - own_bytes))


def fit_slots(requested: int, max_len: int, budget_tokens: int | None) -> int:
    """Slots of `max_len` tokens within `budget_tokens` (at most `requested`, at least 1).

    The cache holds one row of `max_len` beside the slots, the scratch row that free slots
    riding in a decode step write to (engine.forward.SlotKV), and the budget pays for it:
    `budget_tokens // max_len - 1` slots. ValueError when the budget cannot hold even one
    sequence of `max_len` beside it: the engine could generate nothing, which a user must
    hear at start-up, not as a stall.
    """
    if budget_tokens is None:
        return requested
    rows = budget_tokens // max_len
    if rows < 2:
        raise ValueError(
            f"engine: a KV cache of {budget_tokens} tokens cannot hold one sequence of "
            f"{max_len} tokens beside its scratch row ({2 * max_len} needed); raise "
            f"engine.max_tokens / engine.memory_fraction or lower engine.max_len"
        )
    return min(requested, rows - 1)


def fit_slots_in_bytes(
    requested: int, max_len: int, budget_bytes: int, token_bytes: int, slot_bytes: int = 0
) -> int:
    """Slots of `max_len` tokens within `budget_bytes` (at most `requested`, at least 1): each
    takes a cache row (`max_len` x `token_bytes`, `kv_bytes_per_token`) and `slot_bytes` more
    (its rows of the graph outputs, `graph_bytes` of one slot), and the scratch row takes a
    cache row: `(budget - row) // (row + slot_bytes)`. With `slot_bytes` 0 this is `fit_slots`
    of `budget_bytes // token_bytes` tokens. ValueError when not even one sequence fits."""
    row = max_len * token_bytes
    n = (budget_bytes - row) // (row + slot_bytes)
    if n < 1:
        raise ValueError(
            f"engine: {budget_bytes / 2**20:.1f} MiB for the KV cache and CUDA-graph outputs "
            f"cannot hold one sequence of {max_len} tokens beside the cache's scratch row "
            f"({(2 * row + slot_bytes) / 2**20:.1f} MiB needed); raise engine.memory_fraction "
            f"(or set engine.max_tokens) or lower engine.max_len"
        )
    return min(requested, n)


def engine_slots(
    cfg: ModelConfig,
    dtype: torch.dtype,
    requested: int,
    max_len: int,
    max_tokens: int = 0,
    memory_fraction: float = 0.0,
    free_bytes: int | None = None,
    reserved_bytes: int = 0,
    graphs: bool = False,
    share: float = 1.0,
) -> int:
    """The engine's slots at `max_len` (at most `requested`): within `max_tokens` tokens of
    KV cache if set (`fit_slots`); else, on a device that reports `free_bytes`, within
    `memory_budget` of its `share` of them (`reserved_bytes`: a sampler's staging copy),
    which pays for the KV cache and, with `graphs` (an engine that captures its decode step,
    as every CUDA engine does by default), the graphs' outputs of every span bucket of
    `max_len` (`graph_bytes`); else `requested`. ValueError when the budget holds no
    sequence."""
    if max_tokens > 0:
        return fit_slots(requested, max_len, max_tokens)
    if memory_fraction <= 0 or free_bytes is None:
        return requested
    own = packed_bytes(cfg, dtype) + reserved_bytes
    budget = memory_budget(free_bytes, memory_fraction, own, share)
    buckets = len(span_buckets(max_len)) if graphs else 0
    per_slot = graph_bytes(1, cfg.vocab_size, dtype, buckets)
    return fit_slots_in_bytes(requested, max_len, budget, kv_bytes_per_token(cfg, dtype), per_slot)


def free_device_bytes(device: torch.device) -> int | None:
    """Free memory of a CUDA device (None on the CPU: no bound from memory there)."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def engine_max_len(longest_prompt: int, max_new_tokens: int, cfg: ModelConfig, cap: int = 0) -> int:
    """Longest sequence the engine holds: `cap` if set, else the longest prompt plus
    `max_new_tokens`, never beyond the model's `max_position_embeddings`."""
    want = cap if cap > 0 else longest_prompt + max_new_tokens
    return max(2, min(want, cfg.max_position_embeddings))


def fits(prompt_len: int, max_new_tokens: int, max_len: int) -> bool:
    """A prompt of `prompt_len` tokens fits the engine with room for its whole completion."""
    return prompt_len + max_new_tokens <= max_len
