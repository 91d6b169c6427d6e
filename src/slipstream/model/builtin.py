"""The built-in tiny model: a 4-layer Llama with a character tokenizer, for the built-in task.

It is trained from scratch (no hub exists here): `train.warmstart` gives it a short supervised
start and caches the result as an ordinary Hugging Face folder.
"""

from __future__ import annotations

import torch

from slipstream.model.llama import CausalLM, ModelConfig
from slipstream.model.tokenizer import Tokenizer, char_tokenizer
from slipstream.tasks.arithmetic import ALPHABET as BUILTIN_ALPHABET


def builtin_tokenizer(alphabet: str = BUILTIN_ALPHABET) -> Tokenizer:
    return char_tokenizer(alphabet)


def builtin_config(vocab_size: int) -> ModelConfig:
    return ModelConfig(
        model_type="llama",
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=1,
        pad_token_id=0,
    )


def init_builtin(seed: int, alphabet: str = BUILTIN_ALPHABET) -> tuple[CausalLM, Tokenizer]:
    """A freshly initialised built-in model (normal(0, 0.02) weights, as Llama's init), with a
    character tokenizer of `alphabet` (the built-in task's; the agentic task adds letters)."""
    tok = builtin_tokenizer(alphabet)
    torch.manual_seed(seed)
    model = CausalLM(builtin_config(tok.vocab_size))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.zero_()
    return model, tok
