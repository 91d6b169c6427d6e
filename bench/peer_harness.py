"""The harness of bench/peer_trl.py: TRL's kind of small-model test bed, built here.

- The task: "A+B=" addition, A and B in [0, 99], the answer the decimal sum; reward 1 for the
  exact answer. Held-out: `HELDOUT` pairs drawn once (seed 0), disjoint from the training pairs.
- The tokenizer: one token per character (`0-9 + =`) plus `<pad>`, `<bos>`, `<eos>`, a
  `tokenizers` WordLevel model whose post-processor prepends `<bos>` (as TRL's tiny test models
  and Llama's tokenizers do), saved as tokenizer.json + tokenizer_config.json.
- The model: `transformers.LlamaForCausalLM`, hidden 128, 4 layers, 4 heads, MLP 512, untied
  embeddings (about 1.05M parameters), warm-started with a plain supervised loop on solved
  training examples until its held-out greedy accuracy reaches a set value, saved with
  `save_pretrained`.
- The evaluator: greedy decoding with `transformers` (prompts of one length batched together,
  so no padding), the same function for every model folder of both systems.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from slipstream.files import write_atomic

ALPHABET = "0123456789+="
SPECIALS = ("<pad>", "<bos>", "<eos>")
HELDOUT = 500
MAX_NEW = 8


def pairs(seed: int = 0) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(training pairs, held-out pairs): all 10,000 pairs, `HELDOUT` of them held out."""
    every = [(a, b) for a in range(100) for b in range(100)]
    random.Random(seed).shuffle(every)
    return every[HELDOUT:], every[:HELDOUT]


def rows(ps: list[tuple[int, int]]) -> list[dict[str, str]]:
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in ps]


def write_tokenizer(folder: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for ch in ALPHABET:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIALS))
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "model_max_length": 64,
    }
    write_atomic(folder / "tokenizer_config.json", json.dumps(cfg, indent=1))


def new_model(seed: int):  # -> transformers.LlamaForCausalLM
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=len(SPECIALS) + len(ALPHABET),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return transformers.LlamaForCausalLM(cfg).float()


@torch.no_grad()
def heldout_accuracy(model, tok, data: list[dict[str, str]]) -> float:
    """Greedy accuracy of a `transformers` model on `data` (`MAX_NEW` new tokens, stop at EOS):
    prompts of equal token length go as one batch, so nothing is padded."""
    model.eval()
    by_len: dict[int, list[tuple[list[int], str]]] = {}
    for r in data:
        ids = tok(r["prompt"])["input_ids"]  # the post-processor's <bos> included
        by_len.setdefault(len(ids), []).append((ids, r["answer"]))
    hits = 0
    for n, items in by_len.items():
        x = torch.tensor([ids for ids, _ in items])
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        for row, (_, answer) in zip(out[:, n:].tolist(), items):
            hits += tok.decode(row, skip_special_tokens=True).strip() == answer
    return hits / len(data)


def evaluate_folder(folder: Path, data: list[dict[str, str]]) -> float:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    return heldout_accuracy(model, tok, data)


def warm_start(folder: Path, target: float, seed: int = 0, max_steps: int = 3000) -> dict:
    """Build the model folder: supervised steps (batch 64, AdamW 1e-3 after a 100-step linear warm-up, loss on the answer and
    EOS) until the held-out greedy accuracy, checked every 100 steps, reaches `target`."""
    import transformers

    write_tokenizer(folder)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = new_model(seed)
    train, held = pairs()
    train_rows, held_rows = rows(train), rows(held)
    seqs = []
    for r in train_rows:
        p = tok(r["prompt"])["input_ids"]
        c = tok(r["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        seqs.append((p, c))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # 3e-3 stalled at a 1.37 loss
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
    rng = random.Random(seed)
    acc, step = 0.0, 0
    while step < max_steps:
        model.train()
        batch = rng.sample(seqs, 64)
        T = max(len(p) + len(c) for p, c in batch)
        ids = torch.full((64, T), tok.pad_token_id)
        labels = torch.full((64, T), -100)
        mask = torch.zeros(64, T, dtype=torch.long)
        for i, (p, c) in enumerate(batch):
            ids[i, : len(p) + len(c)] = torch.tensor(p + c)
            labels[i, len(p) : len(p) + len(c)] = torch.tensor(c)
            mask[i, : len(p) + len(c)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        warm.step()
        step += 1
        if step % 100 == 0:
            acc = heldout_accuracy(model, tok, held_rows)
            print(f"   warm start step {step}: loss {loss.item():.3f}, held-out {acc:.3f}")
            if acc >= target:
                break
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(folder))
    info = {"target": target, "seed": seed, "steps": step, "heldout_acc": acc}
    write_atomic(folder / "warmstart.json", json.dumps(info))  # the cache's mark (peer_trl)
    return info


def write_data(out: Path) -> tuple[Path, Path]:
    """train.jsonl and heldout.jsonl under `out`: {"prompt": "12+7=", "answer": "19"} rows."""
    train, held = pairs()
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.jsonl", out / "heldout.jsonl"
    for path, ps in zip(paths, (train, held)):
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows(ps)))
    return paths
