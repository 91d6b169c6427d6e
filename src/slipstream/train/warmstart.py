"""Supervised warm start of the built-in model on solved examples, cached so it runs once.

A model trained from scratch solves nothing, and RL on all-zero rewards has no signal. A short
supervised start on correct completions brings it into the range where some samples succeed;
it stops as soon as held-out accuracy reaches `target_acc`, so RL starts with room to improve.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from slipstream.config import Config, WarmstartConfig
from slipstream.config.data import EvalConfig, SamplingConfig
from slipstream.model import CausalLM, Tokenizer, load_pretrained, load_tokenizer, save_pretrained
from slipstream.model.builtin import init_builtin
from slipstream.tasks.arithmetic import RunningSums
from slipstream.train.batch import collate, token_logprobs
from slipstream.types import FinishReason, Prompt, Sample

CACHE_VERSION = "ws-2"


def cache_root(cfg: WarmstartConfig) -> Path:
    if cfg.cache_dir:
        return Path(cfg.cache_dir)
    base = os.environ.get("SLIPSTREAM_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "slipstream"
    )
    return Path(base)


def ws_seed(cfg: Config) -> int:
    """The warm start's seed of a run config: `warmstart.seed`, else `run.seed`."""
    seed = cfg.warmstart.seed
    return cfg.run.seed if seed is None else seed


def cache_key(
    task: RunningSums,
    cfg: WarmstartConfig,
    seed: int,
    init: Callable[[int], tuple[CausalLM, Tokenizer]] = init_builtin,
    tag: str = "",
    evaluation: dict[str, int] | None = None,
) -> str:
    """The cache entry of a warm start: everything its weights depend on. `evaluation`: the
    held-out evaluation its stopping rule reads (prompts, new tokens), when it is not the
    default one (the default's entries keep the keys they had)."""
    model, _tok = init(seed)
    spec: dict[str, Any] = {
        "v": CACHE_VERSION,
        "model": asdict(model.config),
        "task": {
            k: getattr(task, k)
            for k in ("num_train", "num_heldout", "k_min", "k_max", "alpha", "seed")
        },
        "ws": cfg.model_dump(exclude={"cache_dir", "seed"}),  # (the seed is `seed`)
        "seed": seed,
    }
    if tag:  # another task's warm start (the built-in task's keys stay as they were)
        spec["tag"] = tag
    if evaluation:  # a smaller evaluation stops earlier, at a weaker model: its own entry
        spec["eval"] = evaluation
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def supervised_sample(prompt: Prompt, tok: Tokenizer) -> Sample:
    completion = [*tok.encode(prompt.answer, add_special_tokens=False), tok.eos_id]
    n = len(completion)
    return Sample(
        prompt.id, tok.encode_prompt(prompt), completion, [0.0] * n, [0] * n, FinishReason.STOP
    )


def supervised_step(
    model: CausalLM,
    opt: torch.optim.Optimizer,
    samples: list[Sample],
    pad_id: int,
    micro_batch: int = 16,
) -> float:
    """One cross-entropy step on the completion tokens of `samples` (length-sorted micro-batches)."""
    samples = sorted(samples, key=lambda s: len(s.prompt_tokens) + s.num_tokens)
    full = collate(samples, [1.0] * len(samples), list(range(len(samples))), pad_id)
    num_tokens = full.loss_mask.sum()
    model.train()
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for start in range(0, len(samples), micro_batch):
        batch = full.slice(slice(start, start + micro_batch))
        logp, _ = token_logprobs(model, batch)
        loss = -(logp * batch.loss_mask).sum() / num_tokens
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return total


def warm_start(
    task: RunningSums,
    cfg: WarmstartConfig,
    seed: int,
    evaluate: Callable[[CausalLM, Tokenizer], float],
    report: Callable[[int, float, float | None], None] = lambda step, loss, acc: None,
    eval_every: int = 50,
    init: Callable[[int], tuple[CausalLM, Tokenizer]] = init_builtin,
    make_sample: Callable[[Prompt, Tokenizer], Sample] = supervised_sample,
    tag: str = "",
    evaluation: dict[str, int] | None = None,
) -> tuple[CausalLM, Tokenizer, dict[str, Any]]:
    """The warm-started built-in model: from the cache, or trained now and cached atomically.

    `init`, `make_sample` and `tag` make it another task's (the agentic task's: its alphabet,
    its scripted tool-using traces, its own cache entry); `evaluation` describes what
    `evaluate` reads when it is not the default (`cache_key`)."""
    cfg = cfg.for_task("builtin")  # (a target the caller left unset: the built-in task's)
    target = cfg.target_acc
    assert target is not None
    folder = (
        cache_root(cfg)
        / f"builtin-{tag + '-' if tag else ''}{cache_key(task, cfg, seed, init, tag, evaluation)}"
    )
    if (folder / "warmstart.json").exists():
        info = json.loads((folder / "warmstart.json").read_text())
        return load_pretrained(folder), load_tokenizer(folder), {**info, "cached": True}
    model, tok = init(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99))
    rng = random.Random(seed)
    train = task.train_prompts()
    t0, acc, step = time.perf_counter(), 0.0, 0
    for step in range(1, cfg.max_steps + 1):
        loss = supervised_step(
            model,
            opt,
            [make_sample(rng.choice(train), tok) for _ in range(cfg.batch_size)],
            tok.pad_id,
        )
        acc_now = evaluate(model, tok) if step % eval_every == 0 else None
        report(step, loss, acc_now)
        if acc_now is not None:
            acc = acc_now
            if acc >= target:
                break
    info = {"steps": step, "heldout_acc": acc, "seconds": time.perf_counter() - t0}
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-"))
    save_pretrained(model, tmp)
    tok.save(tmp)
    (tmp / "warmstart.json").write_text(json.dumps(info))
    try:
        os.replace(tmp, folder)
    except OSError:  # another process cached it first
        shutil.rmtree(tmp, ignore_errors=True)
    return model.eval(), tok, {**info, "cached": False}


def warmstart_evaluation(cfg: Config) -> dict[str, int] | None:
    """What the warm start's stopping rule reads, for its cache key: the held-out prompts and
    new tokens of each evaluation, when either is not the default (None then: the default
    entries keep their keys). A 16-prompt evaluation stops at a weaker model, which must not
    be cached as the default's."""
    got = {"prompts": cfg.eval.num_prompts, "max_new_tokens": cfg.sampling.max_new_tokens}
    default = {
        "prompts": EvalConfig().num_prompts,
        "max_new_tokens": SamplingConfig().max_new_tokens,
    }
    return None if got == default else got
