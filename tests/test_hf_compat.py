"""What a user arriving from TRL / verl with a Hugging Face model expects: a checkpoint's
tokenizer renders the chat template the run trained with, template variables
(`task.chat_template_kwargs`), and one-line errors for a model folder's malformed files."""

from __future__ import annotations

import pytest

from chat_model import CHAT_TEMPLATE, qwen2_tokenizer
from slipstream.config import load_config
from slipstream.model import load_tokenizer
from slipstream.schedule.setup import run_tokenizer

transformers = pytest.importorskip("transformers")

USER = [{"role": "user", "content": "What is 2+3?"}]
# a custom template, unlike the folder's own (CHAT_TEMPLATE, with its default system turn)
CUSTOM = (
    "{%- for m in messages %}{{- '[' + m['role'] + '] ' + m['content'] + '\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '[assistant] ' }}{%- endif %}"
)


def test_checkpoint_tokenizer_renders_the_template_file_the_run_used(tmp_path):
    folder = qwen2_tokenizer(tmp_path / "m")
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)  # read first by transformers
    f = tmp_path / "custom.jinja"
    f.write_text(CUSTOM)
    cfg = load_config(None, [f"task.path={tmp_path / 'x.jsonl'}", f"task.chat_template={f}"])
    run_tokenizer(cfg, load_tokenizer(folder)).save(tmp_path / "ckpt")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "ckpt"))
    text = hf.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert text == "[user] What is 2+3?\n[assistant] "
    assert not (tmp_path / "ckpt" / "chat_template.jinja").exists()


def test_checkpoint_tokenizer_keeps_the_models_own_template_under_auto(tmp_path):
    folder = qwen2_tokenizer(tmp_path / "m")
    cfg = load_config(None, [f"task.path={tmp_path / 'x.jsonl'}"])
    run_tokenizer(cfg, load_tokenizer(folder)).save(tmp_path / "ckpt")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "ckpt"))
    text = hf.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a tiny assistant.")
