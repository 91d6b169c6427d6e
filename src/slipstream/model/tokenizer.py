"""Tokenizers through the `tokenizers` library, read from a model folder as the model was trained.

What `transformers` does with the same folder is the reference (tests/test_tokenizer_hf.py):

- BOS/EOS come from tokenizer.json's post-processor (`encode(text)` = `AutoTokenizer.encode`,
  e.g. Llama 3's `<|begin_of_text|>`, or the `<bos>` a WordLevel benchmark model's
  TemplateProcessing prepends). A folder with no post-processor at all whose
  tokenizer_config.json sets `add_bos_token` / `add_eos_token` gets them added here, as the
  Llama and Gemma tokenizer classes of transformers 4 did (they rebuilt the post-processor).
- A chat template's rendering already holds its special tokens: it is encoded with none added
  (`encode(text, add_special_tokens=False)`), as `apply_chat_template(tokenize=True)` does.
- Generation stops at any of `stop_ids`: every `eos_token_id` of generation_config.json and
  config.json, the `eos_token` of tokenizer_config.json, and `sampling.stop` strings that are
  added tokens (`<|im_start|>`). Other stop strings (`stop_strings`) are matched on the text,
  as vLLM matches them: the completion ends at the token whose text completes one, however the
  model's tokens split it (`"</answer>"` then `">\n"` as one byte-level BPE token).
- Text is `decode(ids, skip_special_tokens=True)` of transformers, which TRL gives reward
  functions: with tokenizer_config.json's `clean_up_tokenization_spaces` it drops the spaces
  a word-level decoder leaves before punctuation ("5 ." -> "5."), except on a BPE model
  (transformers 5 skips it there unless told otherwise).

The folder's tokenizer files are kept verbatim (`files`) and `save` writes them back, so a
checkpoint carries the chat template and the generation config of the model it came from;
`with_chat_template` replaces that template by the one a run rendered its prompts with
(`task.chat_template` a file), written as tokenizer_config.json's `chat_template`, as
`save_pretrained` of transformers writes a template set on the tokenizer.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from slipstream.types import Prompt

# the files of a model folder that describe its tokenizer and how it generates
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
)
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
# transformers' `clean_up_tokenization`, replacement by replacement, in its order
CLEAN_UP = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)
BPE_CLEAN_UP = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"


def clean_up_tokenization(text: str) -> str:
    """`text` without the spaces before punctuation and English contractions that
    transformers' `clean_up_tokenization` removes."""
    for old, new in CLEAN_UP:
        text = text.replace(old, new)
    return text


def adds_special_tokens(prompt: Prompt) -> bool:
    """Whether `prompt`'s text is encoded with the special tokens the tokenizer adds: plain
    text takes BOS/EOS; a chat template's rendering (`prompt.messages` set) already holds its
    own and takes none, as `apply_chat_template(tokenize=True)`. `Tokenizer.encode_prompt` and
    `Tokenizer.prompt_lengths` both follow it."""
    return prompt.messages is None


class Tokenizer:
    """Text <-> token ids, plus the special ids generation needs.

    `eos_id` is the primary end-of-sequence id (appended by supervised warm start);
    `stop_ids` every id that ends a completion; `stop_strings` stop texts (module docstring);
    `clean_up_spaces`: decoded text goes through `clean_up_tokenization` (module docstring).
    """

    def __init__(
        self,
        inner: HFTokenizer,
        eos_id: int,
        pad_id: int,
        bos_id: int | None = None,
        stop_ids: Iterable[int] = (),
        prepend_bos: bool = False,
        append_eos: bool = False,
        files: dict[str, str] | None = None,
        stop_strings: Sequence[str] = (),
        clean_up_spaces: bool = False,
    ):
        self.inner = inner
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.bos_id = bos_id
        self.stop_ids = frozenset([eos_id, *stop_ids])
        self.stop_strings = tuple(dict.fromkeys(s for s in stop_strings if s))
        # tokens decoded at a completion's tail to find a stop string its newest token ends:
        # every token of the string (at least a byte each) and two more, so that the string's
        # first token is never the window's first (decoders drop a first token's space)
        self._stop_window = max((len(s.encode("utf-8")) for s in self.stop_strings), default=0) + 2
        self._stop_ends = frozenset(s[-1] for s in self.stop_strings)
        self._may_end: dict[int, bool] = {}  # token id -> its text alone may end a stop string
        self.prepend_bos, self.append_eos = prepend_bos, append_eos
        self.files = dict(files or {})
        self.clean_up_spaces = clean_up_spaces

    @property
    def vocab_size(self) -> int:
        return self.inner.get_vocab_size()

    @property
    def config(self) -> dict[str, Any]:
        """tokenizer_config.json of the source folder ({} if it had none)."""
        raw = self.files.get("tokenizer_config.json")
        return json.loads(raw) if raw else {}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; with `add_special_tokens` BOS/EOS as the model's tokenizer adds
        them (module docstring). Added tokens written in the text (`<|im_start|>`) are parsed."""
        ids = self.inner.encode(text, add_special_tokens=add_special_tokens).ids
        return self._added(ids, add_special_tokens)

    def _added(self, ids: list[int], add_special_tokens: bool) -> list[int]:
        """`ids` of the inner tokenizer with, when special tokens are added, the BOS/EOS this
        class adds where the post-processor did not (`encode`, `prompt_lengths`)."""
        if not add_special_tokens:
            return ids
        bos = self.bos_id
        if self.prepend_bos and bos is not None and ids[:1] != [bos]:
            ids = [bos, *ids]
        if self.append_eos and (not ids or ids[-1] != self.eos_id):
            ids = [*ids, self.eos_id]
        return ids

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """A prompt's ids, with special tokens added as `adds_special_tokens(prompt)` says."""
        return self.encode(prompt.text, add_special_tokens=adds_special_tokens(prompt))

    def prompt_lengths(self, prompts: Sequence[Prompt], chunk: int = 1024) -> list[int]:
        """`len(encode_prompt(p))` of each of `prompts`, encoded `chunk` at a time as one batch
        of the `tokenizers` library, which spreads it over the CPU cores (and, from 0.21,
        computes no character offsets): a dataset's every prompt is measured at setup."""
        batch = getattr(self.inner, "encode_batch_fast", self.inner.encode_batch)
        out = [0] * len(prompts)
        for start in range(0, len(prompts), chunk):
            part = range(start, min(start + chunk, len(prompts)))
            for special in (True, False):  # one batch per `adds_special_tokens` value
                idx = [i for i in part if adds_special_tokens(prompts[i]) == special]
                if not idx:
                    continue
                texts = [prompts[i].text for i in idx]
                for i, e in zip(idx, batch(texts, add_special_tokens=special)):
                    out[i] = len(self._added(e.ids, special))
        return out

    def completion_ids(self, ids: Sequence[int]) -> list[int]:
        """`ids` up to, not including, the first stop id (stop strings end the text: `decode`)."""
        for i, t in enumerate(ids):
            if t in self.stop_ids:
                return list(ids[:i])
        return list(ids)

    def text(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens skipped: transformers'
        `decode(ids, skip_special_tokens=True)` (module docstring)."""
        return self._clean(self.inner.decode(list(ids), skip_special_tokens=True))

    def _clean(self, text: str) -> str:
        return clean_up_tokenization(text) if self.clean_up_spaces else text

    def first_stop_string(self, text: str) -> tuple[int, int] | None:
        """(start, end) in `text` of the first stop string it holds (the longest where several
        start there); None if none."""
        hits = [(i, -len(s)) for s in self.stop_strings if (i := text.find(s)) >= 0]
        if not hits:
            return None
        start, neg = min(hits)
        return start, start - neg

    def ends_with_stop_string(self, ids: Sequence[int]) -> bool:
        """Whether the text of a completion's tokens `ids` holds a stop string that its newest
        token completed, read off its last few tokens (the engine asks after every token, so
        an earlier one would have ended it). A token whose text alone holds no stop string's
        last character (nor a partial character, nor anything where a stop string ends in
        whitespace, which a decoder may put between tokens) cannot complete one: it is not
        decoded, which keeps the check off most tokens."""
        if not self.stop_strings or not ids:
            return False
        last = ids[-1]
        may = self._may_end.get(last)
        if may is None:
            piece = self.inner.decode([last], skip_special_tokens=True)
            may = (
                "\ufffd" in piece
                or any(c in piece for c in self._stop_ends)
                or any(c.isspace() for c in self._stop_ends)
            )
            self._may_end[last] = may
        if not may:
            return False
        tail = self.inner.decode(list(ids[-self._stop_window :]), skip_special_tokens=True)
        return any(s in tail for s in self.stop_strings)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of a completion: up to its first stop (a stop id, or where the text's first
        stop string starts), special tokens skipped."""
        raw = self.inner.decode(self.completion_ids(ids), skip_special_tokens=True)
        hit = self.first_stop_string(raw)
        return self._clean(raw[: hit[0]] if hit else raw)

    def decode_with_stop(self, ids: Sequence[int]) -> str:
        """`decode`, with the stop that ended the completion kept (a stop string the model
        wrote, as `</tool_call>`, up to its end; a special token is skipped as in `decode`)."""
        n = len(self.completion_ids(ids))
        raw = self.inner.decode(list(ids[:n]), skip_special_tokens=True)
        hit = self.first_stop_string(raw)
        if hit:
            return self._clean(raw[: hit[1]])
        return self.text(ids[: n + 1])  # the stop id, if there is one

    def with_stop_strings(self, stops: Sequence[str]) -> Tokenizer:
        """A copy that also stops at each string of `stops` (`sampling.stop`): an added token
        (`<|im_start|>`) as a stop id, any other string on the text (module docstring)."""
        added = {t.content: i for i, t in self.inner.get_added_tokens_decoder().items()}
        ids, strings = set(self.stop_ids), list(self.stop_strings)
        for s in stops:
            if s in added:
                ids.add(added[s])
            elif s and s not in strings:
                strings.append(s)
        return Tokenizer(
            self.inner,
            self.eos_id,
            self.pad_id,
            self.bos_id,
            ids,
            self.prepend_bos,
            self.append_eos,
            self.files,
            strings,
            self.clean_up_spaces,
        )

    def with_chat_template(self, source: str) -> Tokenizer:
        """A copy whose saved files render `source` (Jinja): tokenizer_config.json's
        `chat_template`, with the folder's chat_template.jinja / .json dropped, since
        transformers reads those before tokenizer_config.json."""
        files = {k: v for k, v in self.files.items() if k not in CHAT_TEMPLATE_FILES}
        files["tokenizer_config.json"] = json.dumps(
            {**self.config, "chat_template": source}, indent=2, ensure_ascii=False
        )
        out = copy.copy(self)
        out.files = files
        return out

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the tokenizer files: the source folder's verbatim, else generated ones."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if "tokenizer.json" in self.files:
            for name, text in self.files.items():
                (path / name).write_text(text, encoding="utf-8")
            return
        self.inner.save(str(path / "tokenizer.json"))
        special = {
            "eos_token": self.inner.id_to_token(self.eos_id),
            "pad_token": self.inner.id_to_token(self.pad_id),
        }
        if self.bos_id is not None:
            special["bos_token"] = self.inner.id_to_token(self.bos_id)
        cfg = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": self.prepend_bos,
            **special,
        }
        (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
        (path / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
        gen = {"eos_token_id": sorted(self.stop_ids), "pad_token_id": self.pad_id}
        if self.bos_id is not None:
            gen["bos_token_id"] = self.bos_id
        (path / "generation_config.json").write_text(json.dumps(gen, indent=2))


def _special_id(inner: HFTokenizer, value: object) -> int | None:
    if isinstance(value, dict):
        value = value.get("content")
    if isinstance(value, str):
        return inner.token_to_id(value)
    return None


def _ids(value: object) -> list[int]:
    """An `eos_token_id`-style field: an int, a list of ints, or absent."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """Load a model folder's tokenizer: tokenizer.json, special and stop ids from its config
    files (module docstring); the files are kept for `save`."""
    path = Path(path)
    file = path / "tokenizer.json"
    if not file.exists():
        raise FileNotFoundError(f"{path}: no tokenizer.json")
    inner = HFTokenizer.from_file(str(file))
    files = {
        n: (path / n).read_text(encoding="utf-8") for n in TOKENIZER_FILES if (path / n).exists()
    }
    tcfg = _read_json(path / "tokenizer_config.json")
    smap = _read_json(path / "special_tokens_map.json")
    gcfg = _read_json(path / "generation_config.json")
    mcfg = _read_json(path / "config.json")

    def token(key: str) -> int | None:
        found = _special_id(inner, tcfg.get(key))
        return found if found is not None else _special_id(inner, smap.get(key))

    stops = _ids(gcfg.get("eos_token_id")) + _ids(mcfg.get("eos_token_id"))
    eos = token("eos_token")
    if eos is None and stops:
        eos = stops[0]
    if eos is None:
        raise ValueError(f"{path}: cannot tell the end-of-sequence token (no eos_token)")
    pad = token("pad_token")
    for source in (gcfg, mcfg):
        if pad is None and _ids(source.get("pad_token_id")):
            pad = _ids(source.get("pad_token_id"))[0]
    bos = token("bos_token")
    if bos is None:
        bos = next(iter(_ids(gcfg.get("bos_token_id")) + _ids(mcfg.get("bos_token_id"))), None)
    # only a tokenizer without a post-processor takes add_bos_token from its config (docstring)
    bare = inner.post_processor is None
    return Tokenizer(
        inner,
        eos_id=eos,
        pad_id=eos if pad is None else pad,
        bos_id=bos,
        stop_ids=[i for i in stops if 0 <= i < inner.get_vocab_size(with_added_tokens=True)],
        prepend_bos=bare and tcfg.get("add_bos_token") is True,
        append_eos=bare and tcfg.get("add_eos_token") is True,
        files=files,
        clean_up_spaces=cleans_up_spaces(inner, tcfg),
    )


def cleans_up_spaces(inner: HFTokenizer, tcfg: dict[str, Any]) -> bool:
    """Whether transformers' `decode` cleans up the text of this tokenizer (tokenizer_config
    `tcfg`): its `clean_up_tokenization_spaces` (default false), ignored on a BPE model
    unless `BPE_CLEAN_UP` is also set, as transformers 5 reads them."""
    if not tcfg.get("clean_up_tokenization_spaces"):
        return False
    return type(inner.model).__name__ != "BPE" or bool(tcfg.get(BPE_CLEAN_UP))


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
