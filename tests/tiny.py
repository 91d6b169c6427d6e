"""Shared test helpers: the tiny built-in run both the spine and the resume tests train."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from slipstream.config import Config, load_config
from slipstream.engine.stats import PASS_TIMINGS
from slipstream.model import save_pretrained
from slipstream.model.builtin import init_builtin
from slipstream.tasks import RunningSums

TIMING = (
    "wall_s",
    "step_time_s",
    "time/",
    "tokens_per_s",
    "sampler_busy",
    "busy_frac",
    "goodput",
    "weights/",
    "forecast/",
    *(f"engine/{k}" for k in PASS_TIMINGS),
)


def warm_cache(tmp_path: Path) -> Path:
    """The warm-start cache the tests of one pytest session share: a folder of its base
    temporary directory (the parent of every test's `tmp_path`). Entries are keyed by the
    model, task, warm-start settings and seed (train.warmstart.cache_key), so sharing them
    only skips retraining an identical warm start (~12 s each on this CPU)."""
    return tmp_path.parent / "warmstart-cache"


def tiny_cfg(tmp_path: Path, name: str, *extra: str, steps: int = 3) -> Config:
    """The built-in task at 4 prompts x 4 samples, a 30-step warm start (`warm_cache`)."""
    cache = warm_cache(tmp_path)
    return load_config(None, [
        f'run.dir="{tmp_path / name}"', f"run.steps={steps}", "run.quiet=true", "run.threads=1",
        "trainer.batch_prompts=4", "sampling.group_size=4", "eval.every=2", "eval.num_prompts=16",
        "warmstart.max_steps=30", "warmstart.target_acc=0.99", f'warmstart.cache_dir="{cache}"',
        "filters.zero_variance=false", "checkpoint.every=2", *extra,
    ])  # fmt: skip


def steady(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records without their timings (which differ between two runs of the same trajectory)."""
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in records]


def write_assets(folder: Path, reward_source: str) -> Path:
    """The orchestrator tests' tiny run inputs in `folder`: the built-in model with wider
    weights than its init (varied completions, lengths and rewards), its tokenizer, 200
    running-sums rows as JSONL and `reward.py` holding `reward_source`."""
    model, tok = init_builtin(seed=3)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.1)
    save_pretrained(model, folder / "model")
    tok.save(folder / "model")
    rows = RunningSums(num_train=200, num_heldout=8).train_prompts()
    (folder / "rows.jsonl").write_text(
        "".join(json.dumps({"prompt": p.text, "answer": p.answer}) + "\n" for p in rows)
    )
    (folder / "reward.py").write_text(reward_source)
    return folder
