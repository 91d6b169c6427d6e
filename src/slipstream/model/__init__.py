"""The decoder (Llama/Qwen family), Hugging Face checkpoints, tokenizers, the built-in model.

Public surface: `load_pretrained(path, dtype)`, `save_pretrained(model, path)`,
`load_tokenizer(path)`, `CausalLM`, `ModelConfig`, `KVCache`.
"""

from slipstream.model.hf import load_pretrained, save_pretrained
from slipstream.model.llama import CausalLM, KVCache, ModelConfig
from slipstream.model.tokenizer import Tokenizer, char_tokenizer, load_tokenizer

__all__ = [
    "CausalLM",
    "KVCache",
    "ModelConfig",
    "Tokenizer",
    "char_tokenizer",
    "load_pretrained",
    "load_tokenizer",
    "save_pretrained",
]
