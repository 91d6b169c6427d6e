"""What a user arriving from TRL / verl with a Hugging Face model expects: a checkpoint's
tokenizer renders the chat template the run trained with, template variables
(`task.chat_template_kwargs`), and one-line errors for a model folder's malformed files."""

from __future__ import annotations

import pytest

from chat_model import CHAT_TEMPLATE, qwen2_tokenizer
from slipstream.config import load_config
from slipstream.model import load_tokenizer
from slipstream.run.setup import run_tokenizer

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


# Qwen3's switch, as its template has it: an empty think block when thinking is off
THINKING = (
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and "
    "enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def test_chat_template_kwargs_reach_training_and_evaluation_prompts(tmp_path):
    import pickle

    from slipstream.run.setup import eval_sets, row_format
    from slipstream.tasks.rows import read_prompts

    folder = qwen2_tokenizer(tmp_path / "m", chat_template=THINKING)
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "What is 2+3?", "answer": "5"}\n')
    cfg = load_config(None, [
        f"model.path={folder}", f"task.path={data}", f'eval.sets={{extra="{data}"}}',
        "task.chat_template_kwargs={enable_thinking=false}",
    ])  # fmt: skip
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    want = hf.apply_chat_template(
        USER, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert want.endswith("<think>\n\n</think>\n\n")
    fmt = pickle.loads(pickle.dumps(row_format(cfg)))  # samplers get it pickled
    assert read_prompts(str(data), fmt, "train")[0].text == want
    assert eval_sets(cfg)["extra"][0].text == want


def test_chat_template_kwargs_errors_name_the_key(tmp_path):
    from slipstream.config import ConfigError

    base = [f"task.path={tmp_path / 'x.jsonl'}"]
    with pytest.raises(ConfigError, match=r"task\.chat_template_kwargs: 'tools' is set by"):
        load_config(None, [*base, "task.chat_template_kwargs={tools=1}"])
    with pytest.raises(ConfigError, match=r"task\.chat_template_kwargs: needs a chat template"):
        load_config(None, [*base, "task.chat_template=none", "task.chat_template_kwargs={a=1}"])


def test_a_heldout_split_equal_to_the_training_split_is_an_error(tmp_path):
    from slipstream.config import ConfigError

    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(ConfigError, match=r"task\.heldout_split: 'train' is task\.split"):
        load_config(None, [f"task.path={data}", "task.heldout_split=train"])
    with pytest.raises(ConfigError, match=r"task\.heldout_split: 'train' is task\.split"):
        load_config(
            None, [f"task.path={data}", f"task.heldout_path={data}/.", "task.heldout_split=train"]
        )
    load_config(None, [f"task.path={data}", "task.heldout_split=test"])  # another split
    other = tmp_path / "val"  # the train split of another folder
    load_config(
        None, [f"task.path={data}", f"task.heldout_path={other}", "task.heldout_split=train"]
    )
