"""Real models and data as users have them, end to end: a Qwen2-style chat model trained on a
`messages` Parquet file with TRL- and verl-style rewards, its checkpoint reloaded in
`transformers`; a WordLevel model whose BOS comes from its post-processor, evaluated as
`transformers` evaluates it; the stop token trained on, the prompt never."""

from __future__ import annotations

import json

import pytest
import torch

from chat_model import TOKENIZER_FILES, chat_dataset, chat_model, wordlevel_bos_tokenizer
from slipstream.config import load_config
from slipstream.files import read_jsonl
from slipstream.model import load_pretrained, load_tokenizer
from slipstream.model.chat import load_chat_template
from slipstream.run.evaluate import heldout_accuracy
from slipstream.run.setup import make_engine
from slipstream.run.sync import train_sync
from slipstream.tasks import DatasetTask, load_reward
from slipstream.train.batch import collate
from slipstream.train.checkpoint import list_checkpoints
from slipstream.types import FinishReason, Prompt, Sample

transformers = pytest.importorskip("transformers")
pytest.importorskip("datasets")


@pytest.mark.slow
def test_chat_model_trains_on_messages_parquet_and_reloads_in_transformers(tmp_path):
    model_dir = chat_model(tmp_path / "model")
    data = chat_dataset(tmp_path)
    rewards = tmp_path / "rewards.py"
    run = tmp_path / "run"
    cfg = load_config(None, [
        f"model.path={model_dir}", f"task.path={data}",
        f'task.rewards=[{{fn="{rewards}:short_answer"}}, {{fn="{rewards}:compute_score", weight=2.0}}]',
        f"run.dir={run}", "run.steps=3", "run.quiet=true", "run.threads=1",
        "trainer.batch_prompts=2", "sampling.group_size=2", "sampling.max_new_tokens=8",
        "filters.zero_variance=false", "eval.num_prompts=2", "eval.every=3", "checkpoint.every=3",
        "eval.samples_per_prompt=3", "eval.temperature=1.0", f'eval.sets={{extra="{data}"}}',
        "eval.pass_threshold=0.5",
    ])  # fmt: skip
    train_sync(cfg)
    # the prompt the model saw is the template's rendering, default system turn included
    rollouts = (run / "rollouts.txt").read_text()
    assert (
        "[prompt]\n<|im_start|>system\nYou are a tiny assistant.<|im_end|>\n<|im_start|>user\nWhat is "
        in rollouts
    )
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(
        "reward/compute_score" in r and "reward/compute_score/has_digit" in r for r in records
    )
    assert any("reward/short_answer" in r for r in records)  # None where kind == "free"
    final = records[-1]
    for key in ("heldout/mean@3", "heldout/pass@1", "heldout/pass@3", "heldout/extra/pass@3"):
        assert 0.0 <= final[key] <= 2.5, key  # rewards here are at most 1 + 2 x 1
    assert final["heldout_acc"] == final["heldout/mean@3"]
    assert final["heldout/pass@1"] <= final["heldout/pass@3"]
    # the checkpoint carries the source's tokenizer files verbatim and says its dtype
    ckpt = list_checkpoints(run)[-1] / "model"
    for name in TOKENIZER_FILES:
        assert (ckpt / name).read_text() == (model_dir / name).read_text(), name
    assert json.loads((ckpt / "config.json").read_text())["torch_dtype"] == "float32"
    # ... and loads in transformers to the same chat rendering, ids and logits
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt)).eval()
    conv = [{"role": "user", "content": "What is 3+4?"}]
    text = hf_tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    chat = load_chat_template("auto", str(ckpt))
    assert chat is not None and chat.render(conv) == text
    ours = load_tokenizer(ckpt)
    ids = ours.encode_prompt(Prompt("x", text, None, messages=conv))
    assert ids == hf_tok(text, add_special_tokens=False)["input_ids"]
    trained = load_pretrained(ckpt)
    with torch.no_grad():
        x = torch.tensor([ids])
        torch.testing.assert_close(trained(x), hf_model(x).logits, atol=1e-4, rtol=1e-4)
        assert not torch.equal(trained(x), load_pretrained(model_dir)(x))  # it did train


def _wordlevel_model(folder):
    """A random Llama over the WordLevel vocabulary, saved by transformers with its tokenizer."""
    words = ["what", "is", "one", "two", "plus", "?", "yes", "no", "maybe"]
    wordlevel_bos_tokenizer(folder, words)
    cfg = transformers.LlamaConfig(
        vocab_size=4 + len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    model.save_pretrained(str(folder))
    return model, words


def test_wordlevel_bos_model_scores_as_in_transformers(tmp_path):
    """The issue's measured bug: the <bos> of a post-processor lost made a model score 0.000
    here and 0.735 in transformers. Answers are transformers' own greedy completions for
    half the prompts, so transformers scores exactly 0.5; so must slipstream."""
    hf_model, _ = _wordlevel_model(tmp_path / "m")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    texts = [f"what is {a} plus {b} ?" for a in ("one", "two") for b in ("one", "two", "yes")]
    texts += ["is what", "maybe no yes", "no ?", "two two"]
    rows = []
    for i, text in enumerate(texts):
        ids = hf_tok(text, return_tensors="pt")["input_ids"]
        assert ids[0, 0].item() == hf_tok.bos_token_id
        out = hf_model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        said = hf_tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        rows.append({"prompt": text, "answer": said if i % 2 == 0 else said + " wrong"})
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = DatasetTask(str(data), load_reward("exact"), heldout_fraction=0.0)
    model, tok = load_pretrained(tmp_path / "m"), load_tokenizer(tmp_path / "m")
    prompts = task.train_prompts()
    assert tok.encode_prompt(prompts[0]) == hf_tok(texts[0])["input_ids"]
    engine = make_engine(model, tok, len(prompts), 32)
    assert heldout_accuracy(engine, tok, task, prompts, 6) == 0.5
    tok.inner.post_processor = None  # the old encoding, without the <bos>: the bug shows
    assert heldout_accuracy(make_engine(model, tok, len(prompts), 32), tok, task, prompts, 6) < 0.5


def test_stop_token_is_trained_on_and_the_prompt_never(tmp_path):
    """Every id stops (a set of stop ids): each completion is one stop token, kept in the
    completion's tokens and the loss mask, cut from the text the reward sees."""
    model_dir = chat_model(tmp_path / "model")
    model, tok = load_pretrained(model_dir), load_tokenizer(model_dir)
    tok.stop_ids = frozenset(range(tok.vocab_size))
    from slipstream.engine import Request, SamplingParams

    engine = make_engine(model, tok, 2, 64)
    prompt = tok.encode("What is 2+3?")
    outs = engine.generate(
        [Request(prompt, SamplingParams(1.0, max_new_tokens=8), seed=s) for s in (0, 1)]
    )
    for c in outs:
        assert c.finish_reason == FinishReason.STOP and len(c.tokens) == 1
        assert tok.decode(c.tokens) == ""
    samples = [Sample("p", prompt, c.tokens, c.logp, c.versions, c.finish_reason) for c in outs]
    batch = collate(samples, [1.0, -1.0], [0, 0], tok.pad_id)
    # targets are shifted by one: column len(prompt) - 1 predicts the first completion token
    assert batch.loss_mask.sum(dim=1).tolist() == [1, 1]
    assert batch.loss_mask[:, len(prompt) - 1].all()
    assert batch.targets[0, len(prompt) - 1].item() == outs[0].tokens[0]


def test_a_stop_string_ends_generation_and_is_cut_from_the_text(tmp_path):
    """`sampling.stop` strings: the engine stops at the token whose text completes the match
    (its tokens stay in the completion), the decoded text ends before it."""
    from slipstream.engine import Request, SamplingParams

    model_dir = chat_model(tmp_path / "model")
    model, tok = load_pretrained(model_dir), load_tokenizer(model_dir)
    tok.stop_ids = frozenset()  # greedy runs to max_new_tokens
    prompt = tok.encode("What is 2+3?")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    free = make_engine(model, tok, 1, 64).generate([Request(prompt, greedy)])[0].tokens
    assert len(free) == 12
    stop = tok.inner.decode(free[3:5])  # the text of two tokens, as a stop string
    assert stop.strip() and "\ufffd" not in stop
    tok = tok.with_stop_strings([stop])
    tok.stop_ids = frozenset()  # the string alone ends it
    # the first token at which the completion's text holds the string
    first = next(i for i in range(1, len(free) + 1) if stop in tok.inner.decode(free[:i]))
    out = make_engine(model, tok, 1, 64).generate([Request(prompt, greedy)])[0]
    assert out.tokens == free[:first] and out.finish_reason == FinishReason.STOP
    raw = tok.inner.decode(free[:first])
    assert tok.decode(out.tokens) == raw[: raw.index(stop)]
