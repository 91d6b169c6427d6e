"""Build what a run needs from its `Config`: folder, model, task, engine, trainer, sinks."""

from __future__ import annotations

import json
import random
import tomllib
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from slipstream.algo import advantages, filters
from slipstream.config import Config, dump_config
from slipstream.engine import Engine, Request, SamplingParams, capacity
from slipstream.engine.stats import EngineStats
from slipstream.envs.base import EnvFactory
from slipstream.envs.builtin import tool_sums_task
from slipstream.envs.workers import Workers, make_workers
from slipstream.files import write_atomic
from slipstream.model import CausalLM, Tokenizer, load_pretrained, load_tokenizer
from slipstream.model.chat import ChatTemplateError, load_chat_template
from slipstream.observe.progress import ProgressView
from slipstream.observe.rollouts import RolloutWriter
from slipstream.observe.sinks import FanOut, make_sinks
from slipstream.observe.timeline import TimelineWriter
from slipstream.run import drawing
from slipstream.run.agentic import (
    build_env_factory,
    env_max_len,
    episode_rewards,
    warm_start_tools,
)
from slipstream.run.components import (
    build_trainer,
    check_too_long,
    engine_shape,
    make_pass_rate_tracker,
    prompt_lengths,
    resolve_placement,
)
from slipstream.run.evaluate import PromptIds, heldout_accuracy, rewards_of, summarize
from slipstream.run.folder import make_run_dir
from slipstream.runtime import placement
from slipstream.schedule.agentic import episode_group, make_runner
from slipstream.schedule.episodes import run_episodes
from slipstream.schedule.group_size import allocate_group_sizes
from slipstream.schedule.ledger import Ledger
from slipstream.schedule.pass_rate import PassRateTracker
from slipstream.schedule.replay import ReplayBuffer
from slipstream.schedule.sampler import score_group
from slipstream.sim.forecast import OnlineForecast
from slipstream.tasks import DatasetTask, PromptSource, RowFormat, RunningSums, Task, TaskError
from slipstream.tasks.datasets import Split
from slipstream.tasks.guard import ERRORS, GuardedTask, Isolation, RewardGuard, unguarded
from slipstream.tasks.jsonl import BUILTIN_REWARDS
from slipstream.tasks.rewards import CombinedReward, RewardPart
from slipstream.tasks.rows import read_prompts
from slipstream.train.trainer import Trainer
from slipstream.train.warmstart import warm_start, warmstart_evaluation, ws_seed
from slipstream.types import FinishReason, Group, Prompt, Sample, TrainerState

if TYPE_CHECKING:
    from slipstream.schedule.watchdog import Watchdog


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
    replay: ReplayBuffer | None = None  # with replay.enabled
    rng: random.Random = field(default_factory=random.Random)  # replay's choices; seeded in setup
    counters: Counter[str] = field(default_factory=Counter)  # see schedule.sync.COUNTERS
    ends_said: set[str] = field(default_factory=set)  # episode ends warned of (_count_error)
    eval_sets: dict[str, list[Prompt]] = field(default_factory=dict)  # eval.sets, by name
    eval_metrics: dict[str, float] = field(default_factory=dict)  # of the latest evaluation
    # and its rewards: (prompt id, [n]) of each prompt evaluated, by set ("": held-out)
    eval_rewards: dict[str, list[tuple[str, list[float]]]] = field(default_factory=dict)
    eval_ids: PromptIds = field(default_factory=PromptIds)  # the held-out sets' token ids
    env_factory: EnvFactory | None = None  # env.tools: every sample is an episode
    env_workers: Workers | None = None  # where its environments step (made on first use)
    max_len: int = 0  # longest prompt + completion the engine holds; 0: no bound (see `fits`)
    placement: placement.Placement = field(
        default_factory=lambda: placement.Placement("cpu", ("cpu",))
    )
    keep_steps: Callable[[], set[int]] | None = None  # checkpoints `keep` spares (watchdog)
    watchdog: Watchdog | None = None  # run.rollback.make_watchdog; checkpointed with the run
    forecast: OnlineForecast | None = None  # time to the end, added to each step record

    @property
    def params(self) -> SamplingParams:
        s = self.cfg.sampling
        return SamplingParams(s.temperature, s.top_p, s.top_k, s.max_new_tokens)

    def evaluate(self, version: int | None = None) -> float:
        """Held-out accuracy (`mean@n` of the held-out split, greedy for n = 1) of the weights,
        as policy `version` (a reward's `trainer_state`; default: the eval engine's); every
        metric, of each `eval.sets` set too, lands in `eval_metrics`, its rewards in
        `eval_rewards`. Multi-turn runs: n episodes of each prompt, of every set. A prompt too
        long (`fits`) is skipped, as in training, and counted (`heldout/skipped_too_long`,
        `heldout/<set>/...`): the metrics are over the prompts evaluated (`check_too_long`).
        `eval_engine` is the run's engine: the trainer's own weights (one packed copy, one KV
        cache in the trainer process, never a second model); its counters are set aside, so
        evaluation never counts as rollout."""
        engine = self.eval_engine
        saved, engine.stats = engine.stats, EngineStats()
        try:
            return self._evaluate(engine.version if version is None else version)
        finally:
            engine.stats = saved

    def _evaluate(self, version: int) -> float:
        e, s = self.cfg.eval, self.cfg.sampling
        # greedy (eval.temperature 0) drops top-p / top-k in SamplingParams itself
        params = SamplingParams(e.temperature, s.top_p, s.top_k, s.max_new_tokens)
        at = TrainerState(version, self.cfg.run.steps)  # TRL's trainer_state
        sets = {"": self.heldout, **self.eval_sets}
        out: dict[str, float] = {}
        self.eval_rewards = {}
        for name, prompts in sets.items():
            if self.env_factory is not None:  # episodes: n per prompt
                kept = list(range(len(prompts)))  # an episode's length is the env's to bound
                rewards = episode_rewards(
                    self.cfg, self.env_factory, self.eval_engine, prompts, self.workers(),
                    params, e.samples_per_prompt,
                )  # fmt: skip
            else:
                ids = self.eval_ids.of(name, prompts, self.tok)  # encoded at the first evaluation
                kept = [i for i, x in enumerate(ids) if self.fits(x)]  # the rest skipped (`draw`)
                rewards = rewards_of(
                    self.eval_engine, self.tok, self.task, [prompts[i] for i in kept], params,
                    e.samples_per_prompt, state=at, ids=[ids[i] for i in kept],
                )  # fmt: skip
            self.eval_rewards[name] = [(prompts[i].id, r) for i, r in zip(kept, rewards)]
            found = summarize(rewards, e.pass_threshold)
            if len(kept) < len(prompts):
                found["skipped_too_long"] = len(prompts) - len(kept)
            out.update({f"heldout/{name + '/' if name else ''}{k}": v for k, v in found.items()})
        self.eval_metrics = out
        return out.get(f"heldout/mean@{e.samples_per_prompt}", 0.0)  # the held-out split's

    def requests(
        self, prompt: Prompt, group_size: int, ids: list[int] | None = None
    ) -> list[Request]:
        """G requests for one prompt, of its `ids` where `draw` encoded them (else encoded here)."""
        ids = self.tok.encode_prompt(prompt) if ids is None else ids
        seeds = self.seeds(group_size)
        return [Request(ids, self.params, seed=s, key=(prompt, g)) for g, s in enumerate(seeds)]

    def seeds(self, group_size: int) -> list[int]:
        """The G seeds of the next prompt to generate, each its own (reproducible,
        batch-independent): from the run's seed and the draw counter, which this advances."""
        self.draws += 1
        base = (self.cfg.run.seed * 1_000_003 + self.draws * 4099) & 0x7FFFFFFF
        return [base + g for g in range(group_size)]

    def draw(self, n: int) -> list[drawing.Drawn]:
        """n prompts, those too long or outside the pass-rate band skipped, with the ids that
        measured them (`drawing.draw`)."""
        return drawing.draw(self, n)

    def fits(self, ids: list[int]) -> bool:
        """A prompt of these ids and a whole completion fit the engine's longest sequence."""
        return not self.max_len or capacity.fits(
            len(ids), self.cfg.sampling.max_new_tokens, self.max_len
        )

    def group_sizes(self, prompts: list[Prompt]) -> list[int]:
        """G of each prompt `[B]`: `group_size` each, or with `adaptive_group_size` the split
        of the same budget B x `group_size` that maximises the expected number of informative
        groups given each prompt's smoothed pass rate (schedule.group_size)."""
        s = self.cfg.sampling
        if not s.adaptive_group_size:
            return [s.group_size] * len(prompts)
        rates = [self.pass_rates.smoothed(p.id) for p in prompts]
        return allocate_group_sizes(
            rates, s.group_size * len(prompts), s.group_size_min, s.group_size_max
        )

    def workers(self) -> Workers:
        """The environment workers of this run's episodes (one set, kept across steps)."""
        assert self.env_factory is not None
        if self.env_workers is None:
            e = self.cfg.env
            self.env_workers = make_workers(
                self.env_factory, e.workers, e.isolation, e.worker_concurrency
            )
        return self.env_workers

    def close_workers(self) -> None:
        if self.env_workers is not None:
            self.env_workers.close()
            self.env_workers = None

    def close_observers(self) -> None:
        """Stop the live view (the terminal restored: cursor shown, bar left on its last
        frame) and close the metrics sinks and the timeline. Every loop calls it at its end
        and when it raises; the records written so far stay (each write is flushed)."""
        self.view.close()
        self.sink.close()
        self.timeline.close()

    def write_ledger(self) -> None:
        """`ledger.json` (whole or not at all: `write_atomic`): at the end of a run, and of one
        that stopped on an error."""
        write_atomic(self.dir / "ledger.json", json.dumps(self.ledger.as_dict(), indent=2))

    def rollout(self, drawn: list[drawing.Drawn]) -> list[Group]:
        """One scored group per prompt, of the sizes `group_sizes` gives (waits for the longest)."""
        prompts = [d.prompt for d in drawn]
        sizes = self.group_sizes(prompts)
        if self.env_factory is not None:
            return self._episodes(prompts, sizes)
        completions = self.engine.generate(
            [r for d, g in zip(drawn, sizes) for r in self.requests(d.prompt, g, d.ids)]
        )
        at = TrainerState(self.engine.version, self.cfg.run.steps)  # TRL's trainer_state
        groups, start = [], 0
        for p, g in zip(prompts, sizes):
            self.ledger.generated += 1
            members, start = completions[start : start + g], start + g
            groups.append(score_group(self.tok, self.task, p, members, 0, at))
        return groups

    def _episodes(self, prompts: list[Prompt], sizes: list[int]) -> list[Group]:
        """`rollout` of multi-turn episodes: members' seeds as a single turn's (`seeds`); the
        environment gives each its first turn's ids."""
        assert self.env_factory is not None
        items = [
            (p, (i, m), seed)
            for i, (p, g) in enumerate(zip(prompts, sizes))
            for m, seed in enumerate(self.seeds(g))
        ]
        runner = make_runner(self.cfg, self.env_factory, self.engine, self.params, self.workers())
        try:
            done = {e.key: e for e in run_episodes(self.engine, runner, items)}
        finally:
            runner.close()
        self.ledger.generated += len(prompts)
        groups = [
            episode_group(self.tok, p, [done[(i, m)] for m in range(g)])
            for i, (p, g) in enumerate(zip(prompts, sizes))
        ]
        for g in groups:
            self.ledger.count_episodes(g)
        return groups

    def collect(self, n: int) -> tuple[list[Group], list[Group]]:
        """Draw n prompts, generate and settle: `(every group generated, the groups to train on)`.

        With dynamic sampling (DAPO §3.2) the prompts whose groups the filters dropped are
        replaced by new draws, as many as are missing, until n groups are kept or
        `max_extra_draws` extra prompts were drawn; the step then trains on what it has.
        Drawing only what is missing means no informative group is ever generated and discarded.
        """
        f = self.cfg.filters
        groups = self.rollout(self.draw(n))
        kept = self.settle(groups)
        extra = 0
        while f.dynamic_sampling and not filters.dynamic_sampling_done(
            len(kept), n, extra, f.max_extra_draws
        ):
            more = min(n - len(kept), f.max_extra_draws - extra)
            extra += more
            new = self.rollout(self.draw(more))
            groups += new
            kept += self.settle(new)
        self.counters["filters/extra_draws"] += extra
        return groups, kept

    def settle(self, groups: list[Group]) -> list[Group]:
        """Shaping, replay, filters and advantages of freshly generated groups: the groups to
        train on; each dropped one goes to the ledger with its reason.

        Per group, in order: the pass-rate tracker and the replay buffer see the verifier's
        rewards; overlong `mask` takes truncated samples out; replay swaps stored successes
        into a group with none; overlong `penalty` shapes the rewards that advantages see;
        zero-variance drops a group with equal (shaped) rewards; advantages are computed;
        overlong `mask_loss` then takes truncated samples out (their loss mask is zero).
        A kept group is the input object (advantages set) or, when its samples changed, a new
        `Group`: inputs keep exactly what was generated.

        `tokens/wasted` (in `counters`) grows by every generated token no optimizer step's
        loss takes: dropped groups, masked samples, those replaced by replayed ones, and (where
        the trainer steps) tokens its loss dropped as non-finite and every token of a step it
        skipped (`tokens/computed - tokens/trained`, train.trainer). A kept sample whose advantage
        is 0 is *not* wasted (in the loss mask and the normaliser; dro acts on it). Per step:
        tokens/generated = tokens/trained - tokens/replayed + tokens/wasted.
        """
        kept = []
        for g in groups:
            for s in g.samples:
                if s.reward_error:
                    self._count_error(s)
            self.pass_rates.update(g.prompt.id, g.rewards_G)
            if self.replay is not None:
                self.replay.add(g)
            out, reason = self._prepare(g)
            if reason:
                self.ledger.filtered[reason] += 1
            else:
                kept.append(out)
            self._account(g, None if reason else out)
        return kept

    def _count_error(self, s: Sample) -> None:
        """A verifier's failure counts by its kind (`reward/errors_<kind>`, tasks.guard). An
        episode's environment failure carries its message: said once for each way an episode
        ends, counted as that end (`env/end_<reason>`), not as a metric named by the message."""
        if s.reward_error in ERRORS:
            self.counters[f"reward/errors_{s.reward_error}"] += 1
            return
        end = s.episode.end if s.episode is not None else "error"
        if end not in self.ends_said:
            self.ends_said.add(end)
            warnings.warn(
                f"an episode of prompt {s.prompt_id!r} ended `{end}`: {s.reward_error}; scored "
                f"0. Further such ends are only counted (env/end_{end})",
                RuntimeWarning,
                stacklevel=2,
            )

    def _prepare(self, g: Group) -> tuple[Group, str | None]:
        """`(group to train on, None)` or `(group, reason to drop it)`; see `settle`."""
        f = self.cfg.filters
        if f.overlong in ("mask", "mask_loss"):
            live = [s for s in g.samples if s.finish_reason != FinishReason.LENGTH]
            self.counters["filters/overlong_masked"] += len(g.samples) - len(live)
            # mask: no group left to compare within; mask_loss: no sample left to train
            if len(live) < min(2 if f.overlong == "mask" else 1, len(g.samples)):
                return g, filters.OVERLONG
            if f.overlong == "mask" and len(live) < len(g.samples):
                g = Group(g.prompt, live)
        if self.replay is not None:
            samples, n = self.replay.mix_into(g, self.cfg.replay.per_group, self.rng)
            if n:
                g = Group(g.prompt, samples)
                self.counters["replay/samples"] += n
        rewards_G = self._shaped_rewards(g)
        reason = filters.group_drop_reason(
            rewards_G, [filters.ZERO_VARIANCE] if f.zero_variance else []
        )
        if reason:
            return g, reason
        adv = advantages.compute(torch.tensor([rewards_G]), self.cfg.trainer.advantage)
        g.advantages_G = adv[0].tolist()
        return (filters.without_truncated(g) if f.overlong == "mask_loss" else g), None

    def _shaped_rewards(self, g: Group) -> list[float]:
        """The rewards advantages see: the verifier's, plus DAPO's soft overlong penalty (§3.4)."""
        if self.cfg.filters.overlong != "penalty":
            return g.rewards_G
        lens = torch.tensor([s.num_tokens for s in g.samples])
        pen = filters.overlong_penalty(
            lens, self.cfg.sampling.max_new_tokens, self.cfg.filters.overlong_cache
        )
        return [r + p for r, p in zip(g.rewards_G, pen.tolist())]

    def _account(self, generated: Group, trained: Group | None) -> None:
        """Token counts of one settled group: generated samples not trained on are wasted;
        trained samples that were not generated here are replayed."""
        gen_ids = {id(s) for s in generated.samples}
        kept_ids = {id(s) for s in trained.samples} if trained is not None else set()
        self.counters["tokens/wasted"] += sum(
            s.num_tokens for s in generated.samples if id(s) not in kept_ids
        )
        if trained is not None:
            self.counters["tokens/replayed"] += sum(
                s.num_tokens for s in trained.samples if id(s) not in gen_ids
            )


def build_task(cfg: Config) -> GuardedTask:
    """The task, its reward behind a `RewardGuard` (timeouts, isolation, `reward_errors`)."""
    t = cfg.task
    if t.kind in ("builtin", "builtin_tools"):
        task: Task = RunningSums() if t.kind == "builtin" else tool_sums_task()
        isolation: Isolation = "inline" if t.reward_isolation == "auto" else t.reward_isolation
        return GuardedTask(
            task, RewardGuard(task.reward, isolation, t.reward_timeout_s, t.reward_errors)
        )
    assert t.path is not None
    reward = CombinedReward(
        tuple(RewardPart(e.fn, e.weight, e.name or "", e.shape) for e in t.reward_entries())
    )
    isolation = "inline" if reward.trusted else "process"  # trusted: inline under `auto`
    if t.reward_isolation != "auto":
        isolation = t.reward_isolation
    # a lone built-in is given by name: the guard then names it so in messages
    target = reward.parts[0].spec if reward.trusted and reward.plain else reward
    guard = RewardGuard(target, isolation, t.reward_timeout_s, t.reward_errors)
    task = DatasetTask(
        t.path,
        guard,
        t.heldout_path,
        t.heldout_fraction,
        seed=t.heldout_seed,
        fmt=row_format(cfg, need_answer=needs_answer(cfg)),
        split=t.split,
        heldout_split=t.heldout_split,
        dataset_config=t.dataset_config,
    )
    return GuardedTask(task, guard)


def needs_answer(cfg: Config) -> bool:
    """Whether a built-in reward compares with the rows' answer, which must then be text."""
    return any(e.fn in BUILTIN_REWARDS for e in cfg.task.reward_entries())


def row_format(cfg: Config, need_answer: bool = True) -> RowFormat:
    """How `cfg`'s dataset rows become prompts: columns, template, the model's chat template."""
    t = cfg.task
    try:
        chat = load_chat_template(t.chat_template, cfg.model.path, t.chat_template_kwargs)
    except ChatTemplateError as e:
        raise TaskError(str(e)) from None
    if t.system_prompt and chat is None:
        raise TaskError("task.system_prompt: needs a chat template, and the model has none")
    if t.chat_template_kwargs and chat is None:
        raise TaskError("task.chat_template_kwargs: needs a chat template, and the model has none")
    off = t.chat_template == "none"  # the user's choice, not the model's lack
    return RowFormat(t.columns, t.prompt_template, chat, t.system_prompt, need_answer, off)


def run_tokenizer(cfg: Config, tok: Tokenizer) -> Tokenizer:
    """`tok` as checkpoints save it: with `task.chat_template`'s file as its template when the
    run renders with one, so `AutoTokenizer.from_pretrained(checkpoint)` renders what was
    trained. `task.system_prompt` is per-row data, not template: it stays in the run's
    config.toml, not in the checkpoint."""
    setting = cfg.task.chat_template
    if setting in ("auto", "none"):
        return tok
    return tok.with_chat_template(Path(setting).read_text(encoding="utf-8"))


def eval_sets(cfg: Config) -> dict[str, list[Prompt]]:
    """The named held-out sets of `eval.sets`, read and rendered as the task's rows are."""
    if not cfg.eval.sets:
        return {}
    fmt = row_format(cfg, need_answer=needs_answer(cfg))
    split = Split(cfg.eval.split, "eval.split", unnamed=cfg.eval.split)
    return {
        name: read_prompts(path, fmt, split)[: cfg.eval.num_prompts]
        for name, path in cfg.eval.sets.items()
    }


def build_model(
    cfg: Config, task: Task, view: ProgressView, device: str = "cpu"
) -> tuple[CausalLM, Tokenizer, dict[str, Any]]:
    """The trainer's model on `device` in float32 (master weights; `model.dtype` is the
    compute dtype), and its tokenizer. A checkpoint is built on meta and loaded straight
    onto `device` (no random initialisation)."""
    if cfg.model.path:
        model = load_pretrained(cfg.model.path, device=device)
        tok = run_tokenizer(cfg, load_tokenizer(cfg.model.path))
        return model, tok.with_stop_strings(cfg.sampling.stop), {}
    if cfg.task.kind == "builtin_tools":
        model, tok, info = warm_start_tools(cfg, task, view)
        return model.to(device), tok, info
    builtin = unguarded(task)
    assert isinstance(builtin, RunningSums), "the built-in model only knows the built-in task"
    heldout = task.heldout_prompts()[: cfg.eval.num_prompts]
    max_new = cfg.sampling.max_new_tokens

    def evaluate(model: CausalLM, tok: Tokenizer) -> float:
        engine = make_engine(model, tok, len(heldout), max(tok.prompt_lengths(heldout)) + max_new)
        return heldout_accuracy(engine, tok, task, heldout, max_new)

    def report(step: int, loss: float, acc: float | None) -> None:
        if acc is not None:
            view.log(f"warm start: step {step} loss {loss:.3f} held-out acc {acc:.3f}")

    view.log("warm start of the built-in model (cached after the first run)...")
    ws = cfg.warmstart.for_task("builtin")
    model, tok, info = warm_start(
        builtin, ws, ws_seed(cfg), evaluate, report, evaluation=warmstart_evaluation(cfg)
    )
    tok = tok.with_stop_strings(cfg.sampling.stop)
    view.log(
        f"warm start: {'cached' if info['cached'] else 'trained'}, held-out acc {info['heldout_acc']:.3f}"
    )
    return model.to(device), tok, {"warmstart": info}


def make_engine(model: CausalLM, tok: Tokenizer, num_slots: int, max_len: int, **kw: Any) -> Engine:
    """An engine that stops at every stop id and stop sequence of `tok`."""
    engine = Engine(model, tok.stop_ids, num_slots=num_slots, max_len=max_len, **kw)
    engine.stop_text = tok.ends_with_stop_string if tok.stop_strings else None
    return engine


def _wandb_settings(cfg: Config) -> dict[str, Any]:
    """The `WandbSink` settings: `[wandb]` and the resolved config (not yet in config.toml)."""
    return {**cfg.wandb.model_dump(), "config": tomllib.loads(dump_config(cfg))}


def setup(cfg: Config, resume_step: int | None = None) -> Run:
    """The run `cfg` describes, built in its folder. `resume_step`: the step of the checkpoint
    a resumed run goes on from (its metrics sinks then hide what the run before wrote after
    it), and its config.toml is rewritten only once the checkpoint is restored
    (`run.resume.restore`)."""
    where = resolve_placement(cfg)  # before anything is written: a bad device is exit 2
    placement.use_device(where.trainer)  # the in-process engine's kernels and graphs too
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    torch.manual_seed(cfg.run.seed)
    random.seed(cfg.run.seed)
    view = ProgressView(cfg.run.steps, "slipstream train", quiet=cfg.run.quiet)
    if cfg.task.path:  # a user's dataset may take a while (the built-in task does not)
        view.log(f"reading {cfg.task.path} and rendering its prompts...")
    task = build_task(cfg)
    model, tok, info = build_model(cfg, task, view, where.trainer)
    heldout = task.heldout_prompts()[: cfg.eval.num_prompts]
    train = task.train_prompts()[: cfg.task.max_train_prompts]
    sets = eval_sets(cfg)
    named = {
        "training": train,
        "held-out": heldout,
        **{f"eval.sets.{k}": v for k, v in sets.items()},
    }
    lengths = prompt_lengths(tok, named, view.log)
    every = [n for ns in lengths.values() for n in ns]
    factory = build_env_factory(cfg, tok, task)
    # an episode ends `length` at the model's context: the engine's, and its slots fit to it
    pos, rows = model.config.max_position_embeddings, train + heldout
    context = env_max_len(cfg, factory, rows, tok, pos) if factory is not None else 0
    slots, max_len = engine_shape(
        cfg, where, model, every, cfg.trainer.batch_prompts * cfg.sampling.group_size, context
    )
    skip_len = max_len  # prompts longer than this with a completion are skipped (Run.fits)
    if factory is not None:
        skip_len = 0  # an episode's length is the env's to bound
    else:
        check_too_long(lengths, cfg.sampling.max_new_tokens, skip_len)
    engine = make_engine(model, tok, slots, max_len)
    run_dir = make_run_dir(cfg, config=resume_step is None)  # once the config is known to run
    write_atomic(run_dir / "model_info.json", json.dumps(model.info()))
    return Run(
        cfg=cfg,
        dir=run_dir,
        model=model,
        tok=tok,
        task=task,
        source=PromptSource(train, seed=cfg.run.seed),
        engine=engine,
        eval_engine=engine,  # the trainer's own weights, never a second model (Run.evaluate)
        trainer=build_trainer(cfg, model, tok.pad_id),
        sink=FanOut(make_sinks(run_dir, cfg.run.sinks, _wandb_settings(cfg), resume_step)),
        rollouts=RolloutWriter(run_dir, cfg.run.rollouts_per_step),
        timeline=TimelineWriter(run_dir),
        view=view,
        heldout=heldout,
        pass_rates=make_pass_rate_tracker(cfg),
        info=info,
        replay=ReplayBuffer(cfg.replay.capacity_per_prompt) if cfg.replay.enabled else None,
        rng=random.Random(cfg.run.seed),
        env_factory=factory,
        eval_sets=sets,
        placement=where,
        max_len=skip_len,
        # the forecast's simulations (~0.1 s) are redone every 5 steps or 20 times a run
        forecast=OnlineForecast(
            run_dir,
            cfg.run.steps,
            cfg.eval.every,
            max(5, cfg.run.steps // 20),
            ckpt_every=cfg.checkpoint.every,
        ),
    )
