"""Tokenizers through the `tokenizers` library, read from a model folder's tokenizer.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer


class Tokenizer:
    """Text <-> token ids, plus the special ids generation needs."""

    def __init__(self, inner: HFTokenizer, eos_id: int, pad_id: int, bos_id: int | None = None):
        self.inner = inner
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.bos_id = bos_id

    @property
    def vocab_size(self) -> int:
        return self.inner.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        ids = self.inner.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if self.bos_id is not None else ids

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(ids, skip_special_tokens=True)

    def save(self, path: str | os.PathLike[str]) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.inner.save(str(path / "tokenizer.json"))
        special = {
            "eos_token": self.inner.id_to_token(self.eos_id),
            "pad_token": self.inner.id_to_token(self.pad_id),
        }
        if self.bos_id is not None:
            special["bos_token"] = self.inner.id_to_token(self.bos_id)
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, **special}
        (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


def _special_id(inner: HFTokenizer, value: object) -> int | None:
    if isinstance(value, dict):
        value = value.get("content")
    if isinstance(value, str):
        return inner.token_to_id(value)
    return None


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """Load `tokenizer.json` from a model folder; special ids from its config files."""
    path = Path(path)
    file = path / "tokenizer.json"
    if not file.exists():
        raise FileNotFoundError(f"{path}: no tokenizer.json")
    inner = HFTokenizer.from_file(str(file))
    tcfg = (
        json.loads((path / "tokenizer_config.json").read_text())
        if (path / "tokenizer_config.json").exists()
        else {}
    )
    mcfg = json.loads((path / "config.json").read_text()) if (path / "config.json").exists() else {}
    eos = _special_id(inner, tcfg.get("eos_token"))
    if eos is None:
        raw = mcfg.get("eos_token_id")
        eos = raw[0] if isinstance(raw, list) else raw
    if eos is None:
        raise ValueError(f"{path}: cannot tell the end-of-sequence token (no eos_token)")
    pad = _special_id(inner, tcfg.get("pad_token"))
    if pad is None:
        pad = mcfg.get("pad_token_id") if mcfg.get("pad_token_id") is not None else eos
    bos = None
    if tcfg.get("add_bos_token"):
        bos = _special_id(inner, tcfg.get("bos_token"))
    return Tokenizer(inner, eos_id=eos, pad_id=pad, bos_id=bos)


def char_tokenizer(alphabet: str, specials: tuple[str, ...] = ("<pad>", "<eos>")) -> Tokenizer:
    """A character-level tokenizer: one id per special token, then one per character."""
    vocab = {s: i for i, s in enumerate(specials)}
    for ch in alphabet:
        vocab.setdefault(ch, len(vocab))
    inner = HFTokenizer(models.WordLevel(vocab, unk_token=specials[0]))
    inner.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    inner.decoder = decoders.Fuse()
    inner.add_special_tokens(list(specials))
    return Tokenizer(inner, eos_id=vocab["<eos>"], pad_id=vocab["<pad>"])
