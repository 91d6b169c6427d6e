"""Model folders built here as the hub ships them (no hub is reachable): tokenizers of the
Llama-3, Qwen2, plain-BPE and WordLevel-with-<bos> kinds, and a tiny Qwen2 chat model.

    python tests/chat_model.py OUT   # OUT/model (a chat model folder), OUT/train.parquet,
                                     # OUT/rewards.py: what README's walk-through trains on
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

# the tokenizer files a chat model folder here has (a checkpoint copies them verbatim)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)

TEXTS = [
    "What is 2+3? The answer is 5.",
    "Add 12 and 30. Answer: 42",
    "You are a helpful assistant. Think step by step.",
    "hello world, the cat sat on the mat",
    "Question: how many legs has a spider? 8",
] * 8

# Qwen2-style ChatML, with a default system turn (as Qwen2.5's template has)
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a tiny assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# Qwen2.5-Instruct's tools template (its structure: tools in the system turn, tool calls as
# <tool_call> blocks, consecutive `tool` messages in one user turn of <tool_response> blocks)
QWEN25_TOOLS_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a tiny assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a tiny assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# Qwen2's pre-tokenizer split (its tokenizer.json, and transformers' Qwen2Tokenizer, use it)
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def byte_bpe(specials: list[str], vocab_size: int = 320, qwen2: bool = False) -> Tokenizer:
    """A byte-level BPE (GPT-2 / Llama-3 kind, or with `qwen2` Qwen2's) trained on `TEXTS`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if qwen2:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        TEXTS,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return tok


def _write(folder: Path, tok: Tokenizer, config: dict, generation: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    special = {k: v for k, v in config.items() if k.endswith("_token") and v is not None}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=1))
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation, indent=1))
    return folder


def llama3_tokenizer(folder: Path) -> Path:
    """BOS from a TemplateProcessing post-processor; stops <|end_of_text|>, <|eom_id|>, <|eot_id|>."""
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]
    tok = byte_bpe(names)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                special_tokens=[("<|begin_of_text|>", bos)],
            ),
        ]
    )
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "chat_template": CHAT_TEMPLATE.replace("<|im_start|>", "<|begin_of_text|>"),
    }
    gen = {"bos_token_id": bos, "eos_token_id": [tok.token_to_id(n) for n in names[1:]]}
    return _write(folder, tok, cfg, gen)


def qwen2_tokenizer(folder: Path, chat_template: str = CHAT_TEMPLATE) -> Path:
    """No BOS; ends turns with <|im_end|>, documents <|endoftext|> too (two stop ids)."""
    tok = byte_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], qwen2=True)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    cfg = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": chat_template,
    }
    gen = {"eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]}
    return _write(folder, tok, cfg, gen)


def plain_bpe_tokenizer(folder: Path) -> Path:
    """A byte-level BPE with no post-processor and no BOS (GPT-2 kind)."""
    tok = byte_bpe(["<|endoftext|>"])
    return _write(folder, tok, {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"})


def wordlevel_bos_tokenizer(folder: Path, words: list[str]) -> Path:
    """WordLevel over `words`, BOS prepended by its post-processor (TRL's tiny test models)."""
    vocab = {w: i for i, w in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(["<pad>", "<bos>", "<eos>", "<unk>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
    }
    return _write(folder, tok, cfg, {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})


def chat_model(folder: Path, seed: int = 0) -> Path:
    """A tiny Qwen2 model folder with random weights and the `qwen2_tokenizer`."""
    import torch

    from slipstream.model import CausalLM, ModelConfig, save_pretrained

    qwen2_tokenizer(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    stops = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    cfg = ModelConfig(
        model_type="qwen2",
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        eos_token_id=stops,
        pad_token_id=stops[1],
    )
    torch.manual_seed(seed)
    model = CausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    save_pretrained(model, folder)
    return folder


REWARDS_PY = '''"""Reward functions in the shapes TRL and verl users bring."""


def short_answer(prompts, completions, **kwargs):
    """TRL-style: batched, conversational completions; None where it does not apply."""
    out = []
    for c, kind in zip(completions, kwargs["kind"]):
        text = c[0]["content"]
        out.append(None if kind == "free" else max(0.0, 1.0 - len(text) / 40))
    return out


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl-style: a dict's 'score' is the reward, the rest is logged."""
    hit = float(str(ground_truth) in solution_str)
    return {"score": hit, "has_digit": float(any(ch.isdigit() for ch in solution_str))}
'''


def chat_dataset(folder: Path, n: int = 24) -> Path:
    """`folder/train.parquet` of `messages` rows (+ `answer`, `kind` columns), `rewards.py`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "messages": [{"role": "user", "content": f"What is {i}+{i % 7}?"}],
            "answer": str(i + i % 7),
            "kind": "free" if i % 5 == 0 else "math",
        }
        for i in range(n)
    ]
    pq.write_table(pa.Table.from_pylist(rows), folder / "train.parquet")
    (folder / "rewards.py").write_text(REWARDS_PY)
    return folder / "train.parquet"


USAGE = (
    "usage: python tests/chat_model.py OUT  (writes OUT/model, OUT/train.parquet, OUT/rewards.py)"
)


def main(argv: list[str]) -> int:
    """The README's walk-through inputs in the folder `argv` names; 2 with the usage without one."""
    if len(argv) != 1 or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    out = Path(argv[0])
    chat_model(out / "model")
    chat_dataset(out)
    print(f"wrote {out}/model, {out}/train.parquet, {out}/rewards.py")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
