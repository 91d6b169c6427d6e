"""Multi-turn runs assembled from the config: the environment factory, episodes as groups,
held-out accuracy of episodes, and the per-step episode metrics.

`env.tools = "module:Class"` (or `path/file.py:Class`) makes every sample an episode of a
`ToolEnv` over a fresh instance of that class, rewarded by its `reward(completion=...)` or,
without one, by the task's verifier on the final answer; `env.factory = "module:function"`
builds any token-level `Env` from (row, tokenizer).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import Any

from slipstream import imports
from slipstream.config import Config, ConfigError
from slipstream.engine import Engine, SamplingParams
from slipstream.engine.parking import KVPark
from slipstream.envs.base import EnvFactory, resolve
from slipstream.envs.builtin import RENDERER as BUILTIN_RENDERER
from slipstream.envs.builtin import TOOLS_ALPHABET, Calculator, Latency, scripted_trace
from slipstream.envs.render import HermesRenderer, PlainRenderer, Renderer
from slipstream.envs.tool_env import ToolEnv
from slipstream.model.builtin import init_builtin
from slipstream.model.llama import CausalLM
from slipstream.model.tokenizer import Tokenizer
from slipstream.observe.progress import ProgressView
from slipstream.schedule.episodes import Episode, EpisodeRunner, run_episodes
from slipstream.tasks.arithmetic import RunningSums
from slipstream.tasks.base import Task
from slipstream.tasks.guard import unguarded
from slipstream.train.warmstart import warm_start
from slipstream.types import Group, Prompt, Sample

TOOLS_WARMSTART = "tools2"  # the agentic task's warm-start cache entry (bump on changes)
END_REASONS = ("done", "max_turns", "max_tokens", "length", "timeout", "error", "aborted")


def load_object(spec: str, key: str) -> object:
    """`package.module:name` or `path/to/file.py:name`; a `ConfigError` naming `key`."""
    return imports.load_object(spec, key, ConfigError)


def load_tool_class(spec: str) -> type:
    """The tool class of `env.tools`."""
    cls = load_object(spec, "env.tools")
    if not isinstance(cls, type):
        raise ConfigError(f"env.tools: {spec} is not a class")
    return cls


def calculator_factory(cfg: Config, tok: Tokenizer, latency: Latency | None = None) -> EnvFactory:
    """The built-in agentic task's environments: a `Calculator` of `env.tool_latency_*` (or
    `latency`) per episode, each with its own latency seed."""
    lat = latency or Latency(cfg.env.tool_latency_median_s, cfg.env.tool_latency_p99_s)
    counter = itertools.count()
    base = cfg.run.seed * 1_000_003

    def factory(row: Prompt) -> ToolEnv:
        calc = Calculator(lat, seed=base + next(counter))
        return ToolEnv(calc, row, tok, "plain", BUILTIN_RENDERER)

    return factory


def warm_start_tools(
    cfg: Config, task: Task, view: ProgressView
) -> tuple[CausalLM, Tokenizer, dict[str, Any]]:
    """The built-in model warm-started on scripted tool-using traces (envs.builtin), cached;
    it stops at `warmstart.target_acc` held-out accuracy of greedy episodes (no latency)."""
    sums = unguarded(task)
    assert isinstance(sums, RunningSums)
    heldout = sums.heldout_prompts()[: cfg.eval.num_prompts]
    fast = Latency(0.0, 0.0)

    def evaluate(model: CausalLM, tok: Tokenizer) -> float:
        factory = calculator_factory(cfg, tok, fast)
        max_len = min(env_max_len(cfg, factory, heldout, tok), model.config.max_position_embeddings)
        engine = Engine(model, tok.eos_id, num_slots=len(heldout), max_len=max_len)
        return episode_accuracy(cfg, factory, engine, heldout)

    def report(step: int, loss: float, acc: float | None) -> None:
        if acc is not None:
            view.log(f"warm start: step {step} loss {loss:.3f} held-out acc {acc:.3f}")

    def init(seed: int) -> tuple[CausalLM, Tokenizer]:
        return init_builtin(seed, TOOLS_ALPHABET)

    def trace(prompt: Prompt, tok: Tokenizer) -> Sample:
        return scripted_trace(prompt, tok, tok.eos_id)

    view.log(
        "warm start of the built-in model on tool-using traces (cached after the first run)..."
    )
    model, tok, info = warm_start(
        sums, cfg.warmstart, cfg.run.seed, evaluate, report, init=init, make_sample=trace,
        tag=TOOLS_WARMSTART,
    )  # fmt: skip
    view.log(
        f"warm start: {'cached' if info['cached'] else 'trained'}, held-out acc {info['heldout_acc']:.3f}"
    )
    return model, tok, {"warmstart": info}


def build_env_factory(cfg: Config, tok: Tokenizer, task: Task) -> EnvFactory | None:
    """The factory of one `ToolEnv` per row, or None for a single-turn run."""
    e = cfg.env
    if cfg.task.kind == "builtin_tools":
        return calculator_factory(cfg, tok)
    if e.factory is not None:
        fn = load_object(e.factory, "env.factory")
        if not callable(fn):
            raise ConfigError(f"env.factory: {e.factory} is not callable")
        return lambda row: fn(row, tok)
    if e.tools is None:
        return None
    cls = load_tool_class(e.tools)
    renderer: Renderer = HermesRenderer() if e.tool_format == "hermes" else PlainRenderer()
    lock = threading.Lock()  # episodes end in several worker threads; the verifier is one

    def verify(prompt: Prompt, completion: str) -> float:
        with lock:
            return task.reward(prompt, completion)

    def factory(row: Prompt) -> ToolEnv:
        return ToolEnv(cls(), row, tok, e.tool_format, renderer, reward=verify)

    return factory


def make_runner(
    cfg: Config, factory: EnvFactory, engine: Engine, params: SamplingParams
) -> EpisodeRunner:
    """An episode runner on `engine`, which gets a KV park of `env.park_kv_tokens`."""
    engine.park = KVPark(cfg.env.park_kv_tokens)
    return EpisodeRunner(factory, params, cfg.env, engine.max_len, on_end=engine.park.discard)


def env_max_len(cfg: Config, factory: EnvFactory, prompts: Sequence[Prompt], tok: Tokenizer) -> int:
    """Context an episode can need: the longest rendered first observation + `env.max_tokens`
    (the rendering's overhead measured on the first prompt, the same for every row)."""
    first = resolve(factory(prompts[0]).initial_observation())
    extra = len(first.tokens) - len(tok.encode(prompts[0].text))
    longest = max(len(tok.encode(p.text)) for p in prompts)
    return longest + max(extra, 0) + cfg.env.max_tokens + 1


def episode_group(
    tok: Tokenizer, prompt: Prompt, episodes: list[Episode], sampler_id: int = 0
) -> Group:
    """One group of the G episodes of `prompt`, in member order; each sample's text is the
    whole transcript (`Tokenizer.decode` would stop at the first turn's end)."""
    texts = [tok.inner.decode(e.tokens, skip_special_tokens=True) for e in episodes]
    return Group(prompt, [e.sample(sampler_id, t) for e, t in zip(episodes, texts)])


def episode_accuracy(
    cfg: Config, factory: EnvFactory, engine: Engine, prompts: Sequence[Prompt]
) -> float:
    """Mean reward of greedy episodes of `prompts` (temperature 0), as held-out accuracy."""
    params = SamplingParams(temperature=0.0, max_new_tokens=cfg.sampling.max_new_tokens)
    runner = make_runner(cfg, factory, engine, params)
    try:
        eps = run_episodes(engine, runner, [(p, ("eval", n), 0) for n, p in enumerate(prompts)])
    finally:
        runner.close()
    return sum(e.reward for e in eps) / max(len(eps), 1)


def episode_metrics(groups: Sequence[Group]) -> dict[str, Any]:
    """`env/...` metrics of the episodes among `groups` ({} if there are none)."""
    eps = [s for g in groups for s in g.samples if s.episode is not None]
    if not eps:
        return {}
    stats = [s.episode for s in eps if s.episode is not None]
    turns = sum(e.turns for e in stats)
    out: dict[str, Any] = {
        "env/episodes": len(stats),
        "env/turns_mean": turns / len(stats),
        "env/tool_calls": sum(e.tool_calls for e in stats),
        "env/tool_errors": sum(e.tool_errors for e in stats),
        "env/time_per_turn_s": sum(e.env_time_s for e in stats) / max(turns, 1),
        "env/tokens_trained": sum(s.model_tokens for s in eps),
        "env/tokens_env": sum(e.env_tokens for e in stats),
    }
    for reason in END_REASONS:
        out[f"env/end_{reason}"] = sum(e.end == reason for e in stats)
    return out
