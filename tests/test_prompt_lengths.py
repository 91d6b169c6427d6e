"""Setup measures every prompt of a dataset in batches (`Tokenizer.prompt_lengths`): the
lengths must be exactly those of encoding each prompt alone (`encode_prompt`), for chat
renderings (no special tokens added) and plain text (BOS/EOS added) mixed in one batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chat_model import llama3_tokenizer, plain_bpe_tokenizer, qwen2_tokenizer
from slipstream.model import Tokenizer, load_tokenizer
from slipstream.model.tokenizer import adds_special_tokens
from slipstream.run.components import prompt_lengths
from slipstream.types import Prompt

TEXTS = ["", "What is 2+3?", "<|endoftext|> x", "a  b\n\nc " * 40, "ü€ 😀", "<|im_start|>user\nhi"]


def _prompts() -> list[Prompt]:
    chat = [{"role": "user", "content": "x"}]
    return [
        Prompt(id=f"{i}", text=t, answer="1", messages=chat if i % 2 else None)
        for i, t in enumerate(TEXTS * 3)
    ]


def _bos_eos_tokenizer(folder: Path, eos: bool = True) -> Path:
    """A folder with no post-processor whose config asks for BOS and (`eos`) EOS
    (`Tokenizer._added`)."""
    plain_bpe_tokenizer(folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.update(add_bos_token=True, add_eos_token=eos)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def _bos_tokenizer(folder: Path) -> Path:
    return _bos_eos_tokenizer(folder, eos=False)


MAKERS = [qwen2_tokenizer, llama3_tokenizer, _bos_eos_tokenizer, _bos_tokenizer]


@pytest.mark.parametrize("make", MAKERS)
@pytest.mark.parametrize("chunk", [1, 4, 1024])
def test_batched_lengths_equal_one_by_one(tmp_path: Path, make, chunk: int) -> None:
    tok = load_tokenizer(make(tmp_path / "tok"))
    prompts = _prompts()
    assert tok.prompt_lengths(prompts, chunk=chunk) == [len(tok.encode_prompt(p)) for p in prompts]
    assert tok.prompt_lengths([]) == []


def test_bos_eos_tokenizer_adds_both(tmp_path: Path) -> None:
    """The case above that exercises the added BOS/EOS does add them."""
    tok = load_tokenizer(_bos_eos_tokenizer(tmp_path / "tok"))
    assert tok.prepend_bos and tok.append_eos
    plain = Prompt(id="0", text="hi", answer="1")
    assert tok.prompt_lengths([plain]) == [len(tok.encode("hi", add_special_tokens=False)) + 2]


# special tokens each tokenizer adds to plain text: none (Qwen2), BOS from the
# post-processor (Llama 3), BOS and EOS or BOS alone from tokenizer_config.json
ADDED = [(qwen2_tokenizer, 0), (llama3_tokenizer, 1), (_bos_eos_tokenizer, 2), (_bos_tokenizer, 1)]


@pytest.mark.parametrize("make, added", ADDED)
def test_chat_and_plain_prompts_take_special_tokens_alike(tmp_path: Path, make, added) -> None:
    """`encode_prompt` and `prompt_lengths` follow one rule (`adds_special_tokens`): the same
    text as a chat rendering takes none of the tokens it takes as plain text."""
    tok = load_tokenizer(make(tmp_path / "tok"))
    chat = [{"role": "user", "content": "x"}]
    plain, rendered = (Prompt(id="0", text="hi", answer="1", messages=m) for m in (None, chat))
    assert adds_special_tokens(plain) and not adds_special_tokens(rendered)
    bare = len(tok.encode("hi", add_special_tokens=False))
    for p, n in ((plain, bare + added), (rendered, bare)):
        assert len(tok.encode_prompt(p)) == n
        assert tok.prompt_lengths([p]) == [n]


def test_setup_lengths_are_logged(tmp_path: Path) -> None:
    tok: Tokenizer = load_tokenizer(qwen2_tokenizer(tmp_path / "tok"))
    named = {"training": _prompts(), "held-out": _prompts()[:2]}
    lines: list[str] = []
    chars = sum(len(p.text) for ps in named.values() for p in ps)
    got = prompt_lengths(tok, named, lines.append, many=chars)
    assert got == {k: [len(tok.encode_prompt(p)) for p in ps] for k, ps in named.items()}
    assert lines[0] == "measuring the token length of 20 prompts..."
    assert lines[1].startswith("measured 20 prompts in ")
    quiet: list[str] = []
    assert prompt_lengths(tok, named, quiet.append, many=chars + 1) == got and not quiet
