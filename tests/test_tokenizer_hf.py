"""Tokenization as the model was trained: the same ids as `transformers.AutoTokenizer` for the
same text and the same chat template, on tokenizer folders of the kinds the hub ships."""

from __future__ import annotations

import json

import pytest

from chat_model import (
    CHAT_TEMPLATE,
    llama3_tokenizer,
    plain_bpe_tokenizer,
    qwen2_tokenizer,
    wordlevel_bos_tokenizer,
)
from slipstream.model import load_tokenizer
from slipstream.model.chat import ChatTemplateError, load_chat_template
from slipstream.types import Prompt

transformers = pytest.importorskip("transformers")

TEXTS = ["What is 2+3?", "hello world", " leading space", "Add 12 and 30.\nAnswer:", "<|im_end|>x"]
WORDS = ["what", "is", "2", "+", "3", "?", "the", "answer", "5"]
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+3?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}],
    [
        {"role": "user", "content": "Add 12 and 30."},
        {"role": "assistant", "content": "42"},
        {"role": "user", "content": "and 1?"},
    ],
]
KINDS = {
    "llama3": llama3_tokenizer,
    "qwen2": qwen2_tokenizer,
    "plain_bpe": plain_bpe_tokenizer,
    "wordlevel_bos": lambda f: wordlevel_bos_tokenizer(f, WORDS),
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def folder(request, tmp_path_factory):
    return KINDS[request.param](tmp_path_factory.mktemp(request.param))


def test_encode_matches_auto_tokenizer(folder):
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    tok = load_tokenizer(folder)
    texts = ["what is 2 + 3 ?", "the answer"] if "wordlevel" in str(folder) else TEXTS
    for text in texts:
        assert tok.encode(text) == hf.encode(text), (folder.name, text)
        assert tok.encode(text, add_special_tokens=False) == hf.encode(
            text, add_special_tokens=False
        )


def test_bos_of_a_post_processor_is_kept(tmp_path):
    """The issue's measured bug: a WordLevel model whose post-processor prepends <bos> lost it."""
    tok = load_tokenizer(wordlevel_bos_tokenizer(tmp_path, WORDS))
    assert tok.encode("what is 2 + 3 ?")[0] == tok.bos_id == 1
    assert tok.decode(tok.encode("the answer")) == "the answer"


def test_stop_ids_come_from_every_config_file(tmp_path):
    llama = load_tokenizer(llama3_tokenizer(tmp_path / "l"))
    names = ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]
    assert llama.stop_ids == {llama.inner.token_to_id(n) for n in names}
    assert llama.eos_id == llama.inner.token_to_id("<|eot_id|>")  # tokenizer_config's eos_token
    qwen = load_tokenizer(qwen2_tokenizer(tmp_path / "q"))
    im_end, eot = qwen.inner.token_to_id("<|im_end|>"), qwen.inner.token_to_id("<|endoftext|>")
    assert qwen.stop_ids == {im_end, eot} and qwen.pad_id == eot and qwen.bos_id is None


def test_stop_strings_and_decoding_up_to_the_first_stop(tmp_path):
    tok = load_tokenizer(qwen2_tokenizer(tmp_path)).with_stop_strings(["<|im_start|>", "\n\n"])
    start = tok.inner.token_to_id("<|im_start|>")
    assert start in tok.stop_ids
    im_end = tok.inner.token_to_id("<|im_end|>")
    body = tok.encode("The answer is 5", add_special_tokens=False)
    assert tok.decode([*body, im_end, *tok.encode("junk")]) == "The answer is 5"
    double = tok.encode("\n\n", add_special_tokens=False)
    assert tok.stop_strings == ("\n\n",)  # not an added token: matched on the text
    assert tok.decode([*body, *double, *body]) == "The answer is 5"


def test_a_stop_string_is_found_however_the_tokens_split_it(tmp_path):
    """vLLM matches stop strings on the text: a model that writes the string in other tokens
    than its own encoding (in a sentence, byte-level BPE gives `answer` its leading space:
    `Ganswer`, and merges `>` with what follows) still stops there. Before, only the string's
    own token sequence matched, and generation ran on past it."""
    tok = load_tokenizer(qwen2_tokenizer(tmp_path)).with_stop_strings(["answer is"])
    own = tok.encode("answer is", add_special_tokens=False)
    ids = tok.encode("The answer is 5. Add 12 and 30.", add_special_tokens=False)
    assert not any(tuple(ids[i : i + len(own)]) == tuple(own) for i in range(len(ids)))
    ends = [i for i in range(1, len(ids) + 1) if tok.ends_with_stop_string(ids[:i])]
    first = next(i for i in range(1, len(ids) + 1) if "answer is" in tok.inner.decode(ids[:i]))
    assert ends[0] == first  # the token that completes it, not later, not earlier
    assert tok.decode(ids[:first]) == "The "
    assert tok.decode_with_stop(ids[:first]) == "The answer is"
    assert tok.decode(ids) == "The "  # the first stop wins, whatever follows


def test_add_bos_token_without_a_post_processor(tmp_path):
    """transformers 4's Llama tokenizer classes rebuilt the post-processor from add_bos_token;
    with no post-processor at all, it is the only record of how the model was trained."""
    folder = plain_bpe_tokenizer(tmp_path)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "add_bos_token": True}))
    tok = load_tokenizer(folder)
    assert tok.encode("hello")[0] == tok.bos_id
    assert tok.encode("hello", add_special_tokens=False)[0] != tok.bos_id


@pytest.mark.parametrize("kind", ["llama3", "qwen2"])
def test_chat_template_renders_and_tokenizes_as_transformers(tmp_path, kind):
    folder = KINDS[kind](tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    tok, chat = load_tokenizer(folder), load_chat_template("auto", str(folder))
    assert chat is not None
    for conv in CONVERSATIONS:
        text = chat.render(conv)
        assert text == hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        ids = hf.apply_chat_template(conv, tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert tok.encode_prompt(Prompt("c", text, None, messages=conv)) == list(ids)


def test_chat_template_sources_and_errors(tmp_path):
    folder = plain_bpe_tokenizer(tmp_path / "m")
    assert load_chat_template("auto", str(folder)) is None  # a base model: plain text
    assert load_chat_template("none", str(folder)) is None
    f = tmp_path / "t.jinja"
    f.write_text(CHAT_TEMPLATE)
    chat = load_chat_template(str(f), str(folder))
    assert chat is not None and chat.render([{"role": "user", "content": "hi"}]).endswith(
        "<|im_start|>assistant\n"
    )
    with pytest.raises(ChatTemplateError, match="no such file"):
        load_chat_template(str(tmp_path / "nope.jinja"), None)
    f.write_text("{% if %}")
    with pytest.raises(ChatTemplateError, match=r"t\.jinja: not a valid Jinja template"):
        load_chat_template(str(f), None)
    f.write_text("{{ raise_exception('only user turns') }}")
    with pytest.raises(ChatTemplateError, match="only user turns"):
        load_chat_template(str(f), None).render([])  # type: ignore[union-attr]
    f.write_text("{{ ''.__class__.__mro__ }}")  # the sandbox keeps templates from internals
    with pytest.raises(ChatTemplateError):
        load_chat_template(str(f), None).render([])  # type: ignore[union-attr]


def _spaced_words(folder, clean_up: bool):
    """A WordLevel tokenizer whose decoding joins words with spaces ("5 ." as BERT-era
    word-level models decode), with tokenizer_config.json's `clean_up_tokenization_spaces`."""
    from tokenizers import Tokenizer as Inner
    from tokenizers import models, pre_tokenizers

    from chat_model import _write

    words = [*WORDS, ".", "it", "'s", "n't", ",", "!"]
    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>", *words])}
    inner = Inner(models.WordLevel(vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    inner.add_special_tokens(["<pad>", "<eos>", "<unk>"])
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>",
           "pad_token": "<pad>", "unk_token": "<unk>", "clean_up_tokenization_spaces": clean_up}  # fmt: skip
    return _write(folder, inner, cfg)


def _llama3_cleaning_up(folder):
    """Llama 3's own setting: `clean_up_tokenization_spaces` true on a byte-level BPE."""
    folder = llama3_tokenizer(folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["clean_up_tokenization_spaces"] = True
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("kind", ["words, cleaned up", "words, kept", "bpe, cleaned up"])
def test_decoded_text_is_transformers_decode_under_clean_up_tokenization_spaces(tmp_path, kind):
    """Reward functions get the text TRL gives them, `batch_decode(ids,
    skip_special_tokens=True)`, which applies `clean_up_tokenization_spaces` ("5 ." -> "5.",
    "it 's" -> "it's"; transformers 5 skips it on a BPE model). slipstream decoded without
    it: a reward comparing "answer is 5." scored the same completion otherwise."""
    from slipstream.schedule.agentic import episode_group

    if kind == "bpe, cleaned up":
        folder = _llama3_cleaning_up(tmp_path)
        text = "The answer is 5 . It 's fine , isn't it ?"
    else:
        folder = _spaced_words(tmp_path, clean_up=kind == "words, cleaned up")
        text = "the answer is 5 . it 's 2 , n't !"
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    tok = load_tokenizer(folder)
    ids = tok.encode(text, add_special_tokens=False)
    end = [tok.eos_id, *ids]  # the completion stops at its end token
    want = hf.batch_decode([ids], skip_special_tokens=True)[0]
    assert (want != text) == (kind == "words, cleaned up")  # the case tests what it says
    assert tok.decode([*ids, *end]) == want
    assert tok.text(ids) == want
    assert tok.decode_with_stop([*ids, *end]) == hf.decode(
        [*ids, tok.eos_id], skip_special_tokens=True
    )
    assert tok.with_stop_strings(["!"]).clean_up_spaces == tok.clean_up_spaces

    class Episode:  # the two members episode_group reads
        tokens = ids

        def sample(self, sampler_id: int, text: str) -> str:
            return text

    group = episode_group(tok, Prompt("p", "", None), [Episode()])  # type: ignore[list-item]
    assert group.samples == [want]


def test_every_named_special_token_reaches_the_template_as_transformers_passes_them(tmp_path):
    """transformers renders a template with every named special token of the tokenizer
    (`special_tokens_map`: bos, eos, unk, sep, pad, cls and mask); `mask_token` was missing
    from slipstream's, so a template writing `{{ mask_token }}` rendered it as nothing, and
    slipstream passed `additional_special_tokens`, which transformers 5 does not."""
    from chat_model import _write, byte_bpe

    names = ["<s>", "</s>", "<unk>", "<sep>", "<pad>", "<cls>", "<mask>"]
    keys = ["bos", "eos", "unk", "sep", "pad", "cls", "mask"]
    shown = "".join(f"{k}=[{{{{ {k}_token }}}}] " for k in keys)
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast",
           **{f"{k}_token": n for k, n in zip(keys, names)}, "additional_special_tokens": ["<x>"],
           "chat_template": shown + "{{ additional_special_tokens }}{% for m in messages %}{{ m['content'] }}{% endfor %}"}  # fmt: skip
    folder = _write(tmp_path, byte_bpe([*names, "<x>"]), cfg)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    conv = [{"role": "user", "content": "hi"}]
    chat = load_chat_template("auto", str(folder))
    assert chat is not None
    want = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    assert "mask=[<mask>]" in want
    assert chat.render(conv) == want
