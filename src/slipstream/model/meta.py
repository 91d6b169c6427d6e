"""Models built without initialising them: on the meta device, then materialised once.

`CausalLM(cfg)` runs every layer's random initialiser, on the CPU unless told otherwise: for a
7B model about 28 GB of float32 and minutes of random numbers, all overwritten a moment
later by the checkpoint or the first published weights. Built under `torch.device("meta")`
the parameters have shapes and no storage, so no initialiser touches memory; `empty_model`
then allocates them uninitialised (`to_empty`) on their device in their dtype, and the
caller fills them: `load_pretrained` from safetensors (straight to the device), a sampler
from the first weights it reads off the weight channel (it never generates before them).
"""

from __future__ import annotations

import torch

from slipstream.model.llama import CausalLM, ModelConfig, rope_inv_freq


def meta_model(cfg: ModelConfig) -> CausalLM:
    """A `CausalLM` of `cfg` whose tensors have no storage (nothing initialised)."""
    with torch.device("meta"):
        return CausalLM(cfg)


def empty_model(
    cfg: ModelConfig, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> CausalLM:
    """A `CausalLM` on `device` in `dtype` with uninitialised weights (fill them before use).

    Only the rotary frequencies, which are computed rather than loaded, get real values.
    Tied embeddings are tied again (`to_empty` replaces each module's parameters apart).
    """
    model = meta_model(cfg).to(dtype=dtype).to_empty(device=device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(cfg).to(device)
    return model
