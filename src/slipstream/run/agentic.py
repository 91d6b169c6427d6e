"""Multi-turn runs assembled from the config: the environment factory, the warm start of the
built-in agentic task, the context an episode needs, held-out accuracy of episodes.

`env.tools = "module:Class"` (or `path/file.py:Class`) makes every sample an episode of a
`ToolEnv` over a fresh instance of that class, rewarded by its `reward(completion=...)` or,
without one, by the task's verifier on the final answer; `env.factory = "module:function"`
builds any token-level `Env` from (row, tokenizer). The factories are picklable: they are
sent to the environment workers (and built in each sampler process, `run.sampler`). How an
episode runs and becomes a group is `schedule.agentic` and `schedule.episodes`.
"""

from __future__ import annotations

import os
import threading
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from slipstream import imports
from slipstream.config import Config, ConfigError
from slipstream.engine import Engine, SamplingParams
from slipstream.envs.base import Env, EnvFactory, resolve
from slipstream.envs.builtin import RENDERER as BUILTIN_RENDERER
from slipstream.envs.builtin import TOOLS_ALPHABET, Calculator, Latency, scripted_trace
from slipstream.envs.parse import ToolFormat
from slipstream.envs.render import (
    HermesRenderer,
    PlainRenderer,
    Renderer,
    TemplateRenderer,
    template_tool_format,
)
from slipstream.envs.tool_env import ToolEnv
from slipstream.envs.workers import ThreadWorkers, Workers
from slipstream.model.builtin import init_builtin
from slipstream.model.chat import ChatTemplate, ChatTemplateError, load_chat_template
from slipstream.model.llama import CausalLM
from slipstream.model.tokenizer import Tokenizer
from slipstream.observe.progress import ProgressView
from slipstream.schedule.agentic import make_runner
from slipstream.schedule.episodes import run_episodes
from slipstream.tasks.arithmetic import RunningSums
from slipstream.tasks.base import Task
from slipstream.tasks.guard import unguarded
from slipstream.train.warmstart import warm_start, warmstart_evaluation, ws_seed
from slipstream.types import Prompt, Sample

TOOLS_WARMSTART = "tools2"  # the agentic task's warm-start cache entry (bump on changes)


def load_object(spec: str, key: str) -> object:
    """`package.module:name` or `path/to/file.py:name`; a `ConfigError` naming `key`."""
    return imports.load_object(spec, key, ConfigError)


def load_tool_class(spec: str) -> type:
    """The tool class of `env.tools`."""
    cls = load_object(spec, "env.tools")
    if not isinstance(cls, type):
        raise ConfigError(f"env.tools: {spec} is not a class")
    return cls


@dataclass
class CalculatorFactory:
    """The built-in agentic task's environments: a `Calculator` of `latency` per episode, each
    with its own latency seed (picklable: it is sent to the environment workers)."""

    latency: Latency
    tok: Tokenizer
    base_seed: int = 0
    made: int = 0

    def __call__(self, row: Prompt) -> ToolEnv:
        self.made += 1  # (per worker process: the pid keeps the workers' draws apart)
        seed = zlib.crc32(f"{self.base_seed}:{os.getpid()}:{self.made}:{row.id}".encode())
        return ToolEnv(Calculator(self.latency, seed), row, self.tok, "plain", BUILTIN_RENDERER)


def calculator_factory(cfg: Config, tok: Tokenizer, latency: Latency | None = None) -> EnvFactory:
    """`CalculatorFactory` of `env.tool_latency_*` (or `latency`)."""
    lat = latency or Latency(cfg.env.tool_latency_median_s, cfg.env.tool_latency_p99_s)
    return CalculatorFactory(lat, tok, cfg.run.seed * 1_000_003)


def warm_start_tools(
    cfg: Config, task: Task, view: ProgressView
) -> tuple[CausalLM, Tokenizer, dict[str, Any]]:
    """The built-in model warm-started on scripted tool-using traces (envs.builtin), cached;
    it stops at `warmstart.target_acc` (default 0.25) held-out accuracy of greedy episodes (no
    latency)."""
    sums = unguarded(task)
    assert isinstance(sums, RunningSums)
    heldout = sums.heldout_prompts()[: cfg.eval.num_prompts]
    fast = Latency(0.0, 0.0)

    def evaluate(model: CausalLM, tok: Tokenizer) -> float:
        factory = calculator_factory(cfg, tok, fast)
        max_len = min(env_max_len(cfg, factory, heldout, tok), model.config.max_position_embeddings)
        engine = Engine(model, tok.eos_id, num_slots=len(heldout), max_len=max_len)
        workers = ThreadWorkers(factory, cfg.env.workers)  # the built-in calculator: trusted
        try:
            return episode_accuracy(cfg, factory, engine, heldout, workers)
        finally:
            workers.close()

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
        sums, cfg.warmstart.for_task("builtin_tools"), ws_seed(cfg), evaluate, report, init=init, make_sample=trace,
        tag=TOOLS_WARMSTART, evaluation=warmstart_evaluation(cfg),
    )  # fmt: skip
    view.log(
        f"warm start: {'cached' if info['cached'] else 'trained'}, held-out acc {info['heldout_acc']:.3f}"
    )
    return model, tok, {"warmstart": info}


@dataclass
class TokenEnvFactory:
    """`env.factory`: `function(row, tokenizer)`, the function loaded where it is called (in
    each environment worker: a file path's module need not be importable by name)."""

    spec: str
    tok: Tokenizer

    def __call__(self, row: Prompt) -> Env:
        fn = _cached(self.spec, lambda: load_object(self.spec, "env.factory"))
        assert callable(fn)
        out: Env = fn(row, self.tok)
        return out


@dataclass
class ToolClassFactory:
    """`env.tools`: a fresh instance of the tool class per episode, rewarded by its own
    `reward(completion=...)` or the task's verifier (built once per worker)."""

    cfg: Config
    tok: Tokenizer
    fmt: ToolFormat
    renderer: Renderer

    def __call__(self, row: Prompt) -> ToolEnv:
        cls = _cached(self.cfg.env.tools or "", lambda: load_tool_class(self.cfg.env.tools or ""))
        assert isinstance(cls, type)
        return ToolEnv(cls(), row, self.tok, self.fmt, self.renderer, reward=self._verify)

    def _verify(self, prompt: Prompt, completion: str) -> float:
        from slipstream.run.setup import build_task  # (which imports this module)

        task = cast(Task, _cached(("task", id(self)), lambda: build_task(self.cfg)))
        with _LOCK:  # thread workers: the verifier is one
            return task.reward(prompt, completion)


_CACHE: dict[object, object] = {}
_LOCK = threading.Lock()


def _cached(key: object, make: Callable[[], object]) -> object:
    """What `make` gives, once per process (the workers' own imports and tasks)."""
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = make()
        return _CACHE[key]


def tool_renderer(cfg: Config, tok: Tokenizer) -> tuple[ToolFormat, Renderer]:
    """The call format and renderer of `env.tool_format`: `auto` is the model's chat template
    with the format its tool prompt asks for (`hermes` where it shows `<tool_call>` tags, else
    `json`) where it renders tools, else `plain`."""
    fmt = cfg.env.tool_format
    try:  # (the template the rows are rendered with: plain calls render a row's chat too)
        template = load_chat_template(
            cfg.task.chat_template, cfg.model.path, cfg.task.chat_template_kwargs
        )
    except ChatTemplateError as e:
        raise ConfigError(str(e)) from None
    asked = template_tool_format(template) if template is not None else None
    return _pick_format(fmt, asked, template)


def _pick_format(
    fmt: str, asked: ToolFormat | None, template: ChatTemplate | None
) -> tuple[ToolFormat, Renderer]:
    """`env.tool_format` `fmt` with a chat template asking for calls in `asked` (None: one
    that renders no tools, or none)."""
    if fmt == "plain" or (fmt == "auto" and asked is None):
        return "plain", PlainRenderer(template=template)
    if fmt == "hermes" and asked is None:
        return "hermes", HermesRenderer()
    if asked is None:
        raise ConfigError(
            "env.tool_format: json needs a chat template that renders tools (the model's renders"
            " none); use plain or hermes"
        )
    if fmt != "auto" and fmt != asked:
        raise ConfigError(
            f"env.tool_format: {fmt}, but the model's chat template asks for {asked} tool calls;"
            f" use {asked} or auto"
        )
    assert template is not None
    return asked, TemplateRenderer(template)


def build_env_factory(cfg: Config, tok: Tokenizer, task: Task) -> EnvFactory | None:
    """The picklable factory of one environment per row, or None for a single-turn run."""
    e = cfg.env
    if cfg.task.kind == "builtin_tools":
        return calculator_factory(cfg, tok)
    if e.factory is not None:
        fn = load_object(e.factory, "env.factory")  # (checked here, loaded again in the workers)
        if not callable(fn):
            raise ConfigError(f"env.factory: {e.factory} is not callable")
        return TokenEnvFactory(e.factory, tok)
    if e.tools is None:
        return None
    load_tool_class(e.tools)
    fmt, renderer = tool_renderer(cfg, tok)
    return ToolClassFactory(cfg, tok, fmt, renderer)


def env_max_len(
    cfg: Config,
    factory: EnvFactory,
    prompts: Sequence[Prompt],
    tok: Tokenizer,
    positions: int | None = None,
) -> int:
    """Context an episode can need: the longest first observation + `env.max_tokens` + 1.
    With `positions` (the model's context), a `ConfigError` when no row's first observation
    leaves room for one token of the model's (every episode would end `length` at once,
    training nothing), and a warning naming how many rows do not.

    Of a `ToolEnv` (`env.tools`, the built-in task), every row's first observation is rendered
    (its system prompt, conversation and the tools, as the template writes them for that row),
    the rendering only: the text the tool class's `reset` appends is measured on the first row
    and counted for every row (`reset` is the class's code, once per episode; it may start what
    its episode needs). Another `Env` (`env.factory`) is built for the first row only, for the
    same reason: its overhead over the row's text is counted for every row."""
    env = factory(prompts[0])
    first = resolve(env.initial_observation())
    if isinstance(env, ToolEnv):
        extra = len(first.tokens) - len(env.first_observation(prompts[0]).tokens)
        sizes = [len(env.first_observation(p).tokens) for p in prompts]
    else:
        extra = len(first.tokens) - len(tok.encode(prompts[0].text))
        sizes = [len(tok.encode(p.text)) for p in prompts]
    sizes = [n + max(extra, 0) for n in sizes]
    if positions is not None:
        check_first_observations(sizes, positions)
    return max(sizes) + cfg.env.max_tokens + 1


def check_first_observations(sizes: Sequence[int], positions: int) -> None:
    """A `ConfigError` when no first observation of `sizes` tokens leaves the model room for a
    token within its `positions`; a warning when some do not (those episodes end `length`)."""
    over = sum(n >= positions for n in sizes)
    if over == len(sizes):
        raise ConfigError(
            f"model.path: no episode's first observation (the prompt with the tools rendered) "
            f"fits the model's context of {positions} tokens (max_position_embeddings): the "
            f"shortest is {min(sizes)} tokens; shorten the prompts or the tools' descriptions"
        )
    if over:
        warnings.warn(
            f"{over} of {len(sizes)} episodes' first observations do not fit the model's "
            f"context of {positions} tokens: they end `length` before the model's first token",
            stacklevel=2,
        )


def episode_rewards(
    cfg: Config,
    factory: EnvFactory,
    engine: Engine,
    prompts: Sequence[Prompt],
    workers: Workers | None = None,
    params: SamplingParams | None = None,
    n: int = 1,
) -> list[list[float]]:
    """Rewards `[P][n]` of `n` episodes of each of `prompts` (the shape of
    `run.evaluate.rewards_of`), sampled with `params` (None: greedy, temperature 0). Episode j
    of prompt i has seed `i n + j`, so every evaluation samples with the same random numbers."""
    if params is None:
        params = SamplingParams(temperature=0.0, max_new_tokens=cfg.sampling.max_new_tokens)
    runner = make_runner(cfg, factory, engine, params, workers)
    items = [(p, ("eval", i, j), i * n + j) for i, p in enumerate(prompts) for j in range(n)]
    try:
        eps = run_episodes(engine, runner, items)  # in the order they ended
    finally:
        runner.close()
    out = [[0.0] * n for _ in prompts]
    for e in eps:
        _, i, j = cast(tuple[str, int, int], e.key)
        out[i][j] = e.reward
    return out


def episode_accuracy(
    cfg: Config,
    factory: EnvFactory,
    engine: Engine,
    prompts: Sequence[Prompt],
    workers: Workers | None = None,
    params: SamplingParams | None = None,
    n: int = 1,
) -> float:
    """Mean reward of `episode_rewards` (held-out accuracy, mean@n)."""
    rewards = episode_rewards(cfg, factory, engine, prompts, workers, params, n)
    return sum(map(sum, rewards)) / max(len(rewards) * n, 1)
