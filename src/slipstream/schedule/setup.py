"""Build what a run needs from its `Config`: folder, model, task, engine, trainer, sinks."""

from __future__ import annotations

import datetime as dt
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from slipstream.algo import advantages, filters
from slipstream.config import Config, dump_config
from slipstream.engine import Engine, Request, SamplingParams
from slipstream.model import CausalLM, Tokenizer, load_pretrained, load_tokenizer
from slipstream.observe.progress import ProgressView
from slipstream.observe.rollouts import RolloutWriter
from slipstream.observe.sinks import FanOut, make_sinks
from slipstream.observe.timeline import TimelineWriter
from slipstream.schedule.evaluate import heldout_accuracy
from slipstream.schedule.ledger import Ledger
from slipstream.schedule.pass_rate import PassRateTracker
from slipstream.tasks import JsonlTask, PromptSource, RunningSums, Task, load_reward
from slipstream.train.trainer import Trainer
from slipstream.train.warmstart import warm_start
from slipstream.types import Group, Prompt, Sample


@dataclass
class Run:
    """Everything one run holds; the loop reads and updates it."""

    cfg: Config
    dir: Path
    model: CausalLM
    tok: Tokenizer
    task: Task
    source: PromptSource
    engine: Engine
    eval_engine: Engine
    trainer: Trainer
    sink: FanOut
    rollouts: RolloutWriter
    timeline: TimelineWriter
    view: ProgressView
    heldout: list[Prompt]
    pass_rates: PassRateTracker
    ledger: Ledger = field(default_factory=Ledger)
    draws: int = 0  # prompts drawn so far: the seed counter of sampling
    prompts_skipped: Counter[str] = field(default_factory=Counter)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def params(self) -> SamplingParams:
        s = self.cfg.sampling
        return SamplingParams(s.temperature, s.top_p, s.top_k, s.max_new_tokens)

    def evaluate(self) -> float:
        return heldout_accuracy(self.eval_engine, self.tok, self.task, self.heldout, self.cfg.sampling.max_new_tokens)

    def requests(self, prompt: Prompt, group_size: int) -> list[Request]:
        """G requests for one prompt, each with its own seed (reproducible, batch-independent)."""
        self.draws += 1
        base = (self.cfg.run.seed * 1_000_003 + self.draws * 4099) & 0x7FFFFFFF
        ids = self.tok.encode(prompt.text)
        return [Request(ids, self.params, seed=base + g, key=(prompt, g)) for g in range(group_size)]

    def draw(self, n: int) -> list[Prompt]:
        """n prompts; with the pass-rate band on, mastered and hopeless prompts are skipped here,
        before any generation is spent on them."""
        out: list[Prompt] = []
        tries = 0
        while len(out) < n:
            p = self.source.draw()
            tries += 1
            ok, reason = self.pass_rates.should_draw(p.id) if self.cfg.filters.pass_rate_band else (True, "")
            if ok or tries > 50 * n:  # never spin forever on a fully filtered dataset
                out.append(p)
            else:
                self.prompts_skipped[reason] += 1  # nothing generated: not a ledger entry
        return out

    def score(self, prompt: Prompt, completions: list[Any]) -> Group:
        samples = []
        for c in completions:
            text = self.tok.decode(c.tokens)
            samples.append(Sample(
                prompt.id, c.request.prompt_tokens, c.tokens, c.logp, c.versions, c.finish_reason,
                completion_text=text, reward=float(self.task.reward(prompt, text)), seed=c.request.seed,
                t_start=c.t_start, t_end=c.t_end,
            ))
        self.ledger.generated += 1
        return Group(prompt, samples)

    def settle(self, groups: list[Group]) -> list[Group]:
        """Advantages and filters: the groups to train on; the rest go to the ledger."""
        kept = []
        for g in groups:
            self.pass_rates.update(g.prompt.id, g.rewards_G)
            reason = filters.group_drop_reason(g.rewards_G, ["zero_variance"] if self.cfg.filters.zero_variance else [])
            if reason:
                self.ledger.filtered[reason] += 1
                continue
            adv = advantages.compute(torch.tensor([g.rewards_G]), self.cfg.trainer.advantage)
            g.advantages_G = adv[0].tolist()
            kept.append(g)
        return kept


def make_run_dir(cfg: Config) -> Path:
    path = Path(cfg.run.dir or f"runs/{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}")
    path.mkdir(parents=True, exist_ok=True)
    cfg.run.dir = str(path)
    (path / "config.toml").write_text(dump_config(cfg))
    return path


def build_task(cfg: Config) -> Task:
    if cfg.task.kind == "builtin":
        return RunningSums()
    assert cfg.task.path is not None
    return JsonlTask(
        cfg.task.path, load_reward(cfg.task.reward), cfg.task.heldout_path,
        cfg.task.heldout_fraction, cfg.task.prompt_template, seed=cfg.run.seed,
    )


def build_model(cfg: Config, task: Task, view: ProgressView) -> tuple[CausalLM, Tokenizer, dict[str, Any]]:
    if cfg.model.path:
        return load_pretrained(cfg.model.path), load_tokenizer(cfg.model.path), {}
    assert isinstance(task, RunningSums), "the built-in model only knows the built-in task"
    heldout = task.heldout_prompts()[: cfg.eval.num_prompts]
    max_new = cfg.sampling.max_new_tokens

    def evaluate(model: CausalLM, tok: Tokenizer) -> float:
        engine = Engine(model, tok.eos_id, num_slots=len(heldout), max_len=_max_len(heldout, tok, max_new))
        return heldout_accuracy(engine, tok, task, heldout, max_new)

    def report(step: int, loss: float, acc: float | None) -> None:
        if acc is not None:
            view.log(f"warm start: step {step} loss {loss:.3f} held-out acc {acc:.3f}")

    view.log("warm start of the built-in model (cached after the first run)...")
    model, tok, info = warm_start(task, cfg.warmstart, cfg.run.seed, evaluate, report)
    view.log(f"warm start: {'cached' if info['cached'] else 'trained'}, held-out acc {info['heldout_acc']:.3f}")
    return model, tok, {"warmstart": info}


def _max_len(prompts: list[Prompt], tok: Tokenizer, max_new: int) -> int:
    return max(len(tok.encode(p.text)) for p in prompts) + max_new


def setup(cfg: Config) -> Run:
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)
    run_dir = make_run_dir(cfg)
    view = ProgressView(cfg.run.steps, "slipstream train", quiet=cfg.run.quiet)
    task = build_task(cfg)
    model, tok, info = build_model(cfg, task, view)
    heldout = task.heldout_prompts()[: cfg.eval.num_prompts]
    train = task.train_prompts()
    max_len = max(_max_len(train, tok, cfg.sampling.max_new_tokens), _max_len(heldout, tok, cfg.sampling.max_new_tokens)) if heldout else _max_len(train, tok, cfg.sampling.max_new_tokens)
    slots = cfg.trainer.batch_prompts * cfg.sampling.group_size
    mc = model.config
    (run_dir / "model_info.json").write_text(json.dumps({
        "params": mc.num_params(), "layers": mc.num_hidden_layers, "hidden": mc.hidden_size,
        "kv_heads": mc.num_key_value_heads, "head_dim": mc.head_dim, "vocab": mc.vocab_size,
    }))
    return Run(
        cfg=cfg, dir=run_dir, model=model, tok=tok, task=task,
        source=PromptSource(train, seed=cfg.run.seed),
        engine=Engine(model, tok.eos_id, num_slots=slots, max_len=max_len),
        eval_engine=Engine(model, tok.eos_id, num_slots=max(len(heldout), 1), max_len=max_len),
        trainer=Trainer(model, cfg.trainer, cfg.sampling.temperature, tok.pad_id),
        sink=FanOut(make_sinks(run_dir, cfg.run.sinks)),
        rollouts=RolloutWriter(run_dir, cfg.run.rollouts_per_step),
        timeline=TimelineWriter(run_dir),
        view=view, heldout=heldout,
        pass_rates=PassRateTracker(cfg.filters.pass_rate_low, cfg.filters.pass_rate_high),
        info=info,
    )
