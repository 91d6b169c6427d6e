"""How many tokens, sequences and how long a sequence the engine's KV cache may hold.

The KV cache is `[slots, max_len]` per layer (engine.forward.SlotKV). Its size follows from
the memory the engine is given, never the other way round: `engine.max_tokens`, or
`engine.memory_fraction` of the device's free memory once the model is on it, less the
engine's packed copy of the weights (engine.packed, built at the first step, after the cache
is sized: `packed_bytes`), divided by the bytes one token takes (keys and values of every
layer), is the cache's token budget; the slots are what that budget holds at `max_len` tokens
each, less the cache's scratch row (at most the slots asked for).
A prompt that cannot fit `max_len` with its completion is skipped before generation and
counted, never an error in the middle of a run.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from slipstream.model.llama import ModelConfig


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of one token's keys and values over all layers:
    2 x layers x kv_heads x head_dim x itemsize (Qwen2.5-1.5B, bf16: 2 x 28 x 2 x 128 x 2 =
    28 KiB)."""
    assert cfg.head_dim is not None
    item = torch.empty((), dtype=dtype).element_size()
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
    item = torch.empty((), dtype=dtype).element_size()
    return (h * cfg.vocab_size + cfg.num_hidden_layers * (qkv + o + mlp)) * item


def cache_tokens(
    cfg: ModelConfig,
    dtype: torch.dtype,
    max_tokens: int = 0,
    memory_fraction: float = 0.0,
    free_bytes: int | None = None,
    reserved_bytes: int = 0,
) -> int | None:
    """The KV cache's token budget: `max_tokens` if set, else `memory_fraction` of
    `free_bytes` (measured once the model is on the device) less what the engine's packed
    weights will take (`packed_bytes`) and `reserved_bytes` (a sampler process's staging
    copy of the weights, which its first weight read allocates), over `kv_bytes_per_token`;
    None when neither bounds it. A budget of 0 tokens (the packed copy alone takes the free
    memory) is refused by `fit_slots`."""
    if max_tokens > 0:
        return max_tokens
    if memory_fraction > 0 and free_bytes is not None:
        room = max(0, free_bytes - packed_bytes(cfg, dtype) - reserved_bytes)
        return int(memory_fraction * room) // kv_bytes_per_token(cfg, dtype)
    return None


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


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes the tensors hold (a model's `parameters()`: what a staging copy of it takes)."""
    return sum(t.numel() * t.element_size() for t in tensors)


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
