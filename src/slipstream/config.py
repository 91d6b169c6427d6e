"""Typed, validated configuration: a TOML or YAML file plus dotted command-line overrides.

Every field is documented where it is declared. Loading rejects unknown keys (suggesting the
nearest valid one), wrong types and out-of-range values with a `ConfigError` whose message is
one line naming the key; the CLI turns it into exit code 2.
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, Literal

import tomli_w
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from slipstream.algo import advantages, losses
from slipstream.schedule.presets import PRESETS
from slipstream.text import is_text, read_text


class ConfigError(ValueError):
    """A bad configuration: the message is one line naming the key and what was expected."""


def _check_name(key: str, value: str, valid: Any) -> None:
    if value not in valid:
        raise ValueError(f"{key}: unknown {value!r}; valid: {', '.join(valid)}")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(_Section):
    dir: str | None = None
    """Run folder (metrics, checkpoints, summary). Default: runs/<UTC timestamp>."""
    seed: int = 0
    """Seed of everything random: prompt order, sampling, initialisation."""
    steps: int = Field(200, ge=1)
    """Optimizer steps (policy versions) to train."""
    quiet: bool = False
    """No live display: one plain line per evaluation, for logs and CI."""
    threads: int = Field(0, ge=0)
    """torch intra-op threads; 0 uses every core."""
    sinks: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(default_factory=lambda: ["jsonl"])
    """Metrics sinks; JSONL is always written. tensorboard -> RUN_DIR/tensorboard; wandb runs
    offline (upload later with `wandb sync`)."""
    rollouts_per_step: int = Field(4, ge=0)
    """Samples per step written as text to rollouts.txt (best and worst of a few groups)."""


class ModelSection(_Section):
    path: str | None = None
    """Hugging Face model folder (config.json, *.safetensors, tokenizer.json). None: the
    built-in tiny model, warm-started on the built-in task and cached."""


class TaskConfig(_Section):
    kind: Literal["builtin", "jsonl"] = "builtin"
    """`builtin`: running sums of digits (heavy-tailed lengths). `jsonl`: a file of
    {"prompt": ..., "answer": ...} rows."""
    path: str | None = None
    """The JSONL file of training rows (kind = jsonl)."""
    heldout_path: str | None = None
    """A JSONL file of held-out rows; None holds out `heldout_fraction` of `path`."""
    heldout_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    """Share of `path` held out for evaluation when there is no `heldout_path`."""
    reward: str = "math_verify"
    """`math_verify` (math answers compared by the math-verify library), `exact` (string
    equality after stripping), or a Python reward function `module:function` or
    `path/to/file.py:function` taking (prompt: Prompt, completion: str) -> float."""
    reward_isolation: Literal["auto", "process", "inline"] = "auto"
    """Where the reward runs. `process`: in a worker subprocess, so a reward that hangs, spins in C
    or crashes the interpreter costs one sample (its worker is killed and replaced), not the run;
    one round trip per group. `inline`: in the sampler itself, no IPC and no timeout. `auto`:
    `process` for your own `module:function` / `file.py:function`, `inline` for the built-in task,
    `exact` and `math_verify`."""
    reward_timeout_s: float = Field(10.0, gt=0.0)
    """Longest a reward may take on one completion, in isolation `process`; past it the worker
    is killed and the sample counts as a `timeout` error."""
    reward_errors: Literal["zero", "fail"] = "zero"
    """A reward that raises, returns NaN, inf or a non-number, times out or crashes its worker:
    `zero` scores the sample 0 and counts it (metrics `reward/errors_raised`, `_invalid`,
    `_timeout`, `_crashed`); `fail` stops the run with an error naming the reward, the prompt
    and what happened."""
    prompt_template: str = "{prompt}"
    """How a row's prompt becomes the model's input text (`{prompt}` is replaced)."""
    max_train_prompts: int | None = Field(None, ge=1)
    """Train on the first N training prompts only (None: all). A small pool makes prompts
    recur within a run, as epochs over a fixed dataset do: that is where the pass-rate band
    and adaptive group sizes, which track each prompt's pass rate, have something to act on."""


class SamplingConfig(_Section):
    group_size: int = Field(8, ge=1)
    """G: completions sampled per prompt."""
    temperature: float = Field(0.6, gt=0.0)
    """Sampling temperature; log-probs are recorded, and the trainer evaluates, the
    temperature-scaled distribution, so RL optimises the policy that is sampled."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling; below 1 it biases the importance ratio (see engine.sampling)."""
    top_k: int = Field(0, ge=0)
    """Keep only the k most likely tokens; 0 keeps all."""
    max_new_tokens: int = Field(64, ge=1)
    """Longest completion; longer ones are cut and marked `length`."""
    adaptive_group_size: bool = False
    """Vary G per prompt within the same budget of B x `group_size` samples: prompts with a low
    running pass rate get more samples than easy ones, so that hard prompts still get a group
    with a success and a failure (schedule.group_size, Knapsack RL). Unseen prompts count as
    pass rate 0.5. Off: every prompt gets `group_size`."""
    group_size_min: int = Field(2, ge=1)
    """Smallest group with `adaptive_group_size` (at most `group_size`)."""
    group_size_max: int = Field(32, ge=1)
    """Largest group with `adaptive_group_size` (at least `group_size`)."""


class TrainerConfig(_Section):
    batch_prompts: int = Field(64, ge=1)
    """B: prompts per optimizer step (B x G samples)."""
    lr: float = Field(6e-4, gt=0.0, lt=1.0)
    """AdamW learning rate."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW weight decay."""
    warmup_steps: int = Field(10, ge=0)
    """Linear learning-rate warm-up steps."""
    lr_schedule: Literal["constant", "cosine"] = "cosine"
    """After warm-up: constant, or cosine decay to `lr * lr_min_ratio` at `run.steps`. The decay
    keeps late steps from undoing early gains on small models (noisy RL gradients)."""
    lr_min_ratio: float = Field(0.1, ge=0.0, le=1.0)
    """Final learning rate as a fraction of `lr` (cosine schedule)."""
    grad_clip: float = Field(1.0, gt=0.0)
    """Clip the global gradient norm to this value."""
    micro_batch_size: int = Field(16, ge=1)
    """Samples per forward/backward; the loss normaliser is the whole step's token count, so
    this never changes the gradient."""
    advantage: str = "grpo"
    """Advantage estimator: one of slipstream.algo.advantages.METHODS."""
    loss: str = "ppo"
    """Policy loss: one of slipstream.algo.losses.METHODS."""
    agg: str | None = "seq-mean-token-mean"
    """Loss aggregation (token-mean, seq-mean-token-mean, seq-mean-token-sum, token-sum-norm);
    None uses the loss's own default. The default weighs each sequence equally: on the
    built-in task token-mean lets long failed traces dominate and was less stable."""
    eps_low: float | None = Field(None, ge=0.0)
    """PPO-family lower clip; None uses the loss's default."""
    eps_high: float | None = Field(None, ge=0.0)
    """PPO-family upper clip (clip-higher, DAPO); None uses the loss's default."""
    vcpo: bool = False
    """Scale each step's learning rate by the ESS of its sequence weights (VCPO)."""

    @model_validator(mode="after")
    def _known_methods(self) -> TrainerConfig:
        _check_name("trainer.advantage", self.advantage, advantages.METHODS)
        _check_name("trainer.loss", self.loss, losses.METHODS)
        if self.agg is not None:
            _check_name("trainer.agg", self.agg, losses.AGGS)
        return self


class FilterConfig(_Section):
    zero_variance: bool = True
    """Drop groups whose rewards are all equal: they carry no gradient."""
    pass_rate_band: bool = False
    """Stop drawing prompts whose running pass rate is <= low or >= high (saves generation)."""
    pass_rate_low: float = Field(0.05, ge=0.0, le=1.0)
    """Lower bound of the pass-rate band: prompts at or below it (hopeless) are not drawn."""
    pass_rate_high: float = Field(0.9, ge=0.0, le=1.0)
    """Upper bound of the pass-rate band: prompts at or above it (mastered) are not drawn."""
    pass_rate_min_attempts: int = Field(16, ge=1)
    """Scored samples a prompt needs before the band may exclude it (below, it is always drawn).
    The default is two groups of the default `sampling.group_size` = 8: one group of 8 failures
    happens by chance to 43 % of prompts with a true pass rate of 0.1 (0.9^8), two to 19 %, so
    one group is too little evidence to drop a prompt for good. This is the practice of
    difficulty filtering in DAPO-style training (Skywork-OR1, Polaris): a prompt is judged
    hopeless or mastered from several rollouts' pass rate (16 or more), not from one group;
    DAPO's own dynamic sampling (§3.2) only drops a group, never the prompt."""
    pass_rate_ema_decay: float | None = Field(None, ge=0.0, lt=1.0)
    """None: the band judges the all-time pass rate (passes / attempts). A decay `a`: an
    exponential moving average over groups, `p <- a p + (1 - a) q`, so a prompt that the
    policy has learned leaves the band sooner (a prompt already excluded gets no new groups
    unless `pass_rate_retry_after` re-admits it)."""
    pass_rate_retry_after: int = Field(0, ge=0)
    """Re-admit an excluded prompt: after the band skipped it this many times since its last
    group, it is drawn once more (reason `retry`), so a prompt excluded by chance or since
    learned can come back (as GRESO re-samples skipped prompts with some probability). With
    prompts drawn once per epoch, N means one group every N + 1 epochs. 0: never (excluded
    for the rest of the run)."""
    pass_rate_skip_prob: float = Field(1.0, ge=0.0, le=1.0)
    """s: how surely the band skips a prompt outside it. 1 (default): always, the hard band. Below
    1, the selective-rollout rule of GRESO (Zheng et al. 2025): a prompt outside the band whose
    last z groups each had a pass rate outside it (with G = 8: all failed or all passed, the
    zero-variance groups GRESO counts) is skipped with probability
    `1 - (1 - s)^z` and drawn otherwise, so the longer its uninformative streak, the rarer its
    groups, yet it is never excluded for good: once the policy can solve some of a hopeless
    prompt (or fail a mastered one) its next group ends the streak and it is drawn again. With
    s = 0.5: drawn 1/2 of the time after one such group, 1/8 after three."""
    pass_rate_refill: bool = True
    """What takes a skipped prompt's place in the step. True: the next prompt of the dataset,
    so every step still generates B groups (more of them informative) and epochs end sooner.
    False: nothing, as if its group had been generated and dropped by `zero_variance`: each
    step takes the same B prompts of the dataset as without the band and generates only the
    ones the band lets through (at least one), so the band saves exactly the generation of the
    groups it predicts to be uninformative. Only the `sync` schedule honours False; the other
    schedules issue prompts until a step holds B groups, which refills."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling (§3.2): after filtering, draw more prompts until the step holds B
    informative groups or `max_extra_draws` extra prompts were drawn. Each refill draws only
    the missing number of prompts, so a step never holds more than B groups. Needs
    `zero_variance` (it refills what the filters drop)."""
    max_extra_draws: int = Field(32, ge=0)
    """Bound of dynamic sampling: prompts drawn in one step beyond the first B."""
    overlong: Literal["off", "mask", "penalty"] = "off"
    """Truncated completions (DAPO §3.4). `mask`: a completion cut at max_new_tokens is taken
    out of its group before advantages (its tokens count as tokens/wasted; a group left with
    fewer than 2 samples is dropped, reason `overlong`). `penalty`: add the soft length
    penalty, 0 up to max_new_tokens - overlong_cache, then linear down to -1, to the reward
    used for advantages (the verifier's reward is still what is logged and tracked)."""
    overlong_cache: int = Field(16, ge=0)
    """L_cache of the overlong penalty, in tokens (at most sampling.max_new_tokens)."""


class ReplayConfig(_Section):
    enabled: bool = False
    """Keep past successes of each prompt and replace up to `per_group` samples of a group that
    has no success with stored ones (RePO / RLEP). A replayed sample keeps its behaviour
    log-probs and versions, so the loss's importance ratio corrects for its age."""
    capacity_per_prompt: int = Field(4, ge=1)
    """Successes stored per prompt; the newest are kept."""
    per_group: int = Field(1, ge=1)
    """k: stored successes mixed into one group with no success (at most its size)."""


class ScheduleConfig(_Section):
    name: str = "sync"
    """One of sync, tail_batching, double_buffer, async, pipeline."""
    max_lag: int | None = Field(None, ge=0)
    """K, the largest lag the trainer accepts; None uses the preset's."""
    lag_policy: Literal["drop", "abort", "keep"] = "drop"
    """A group whose oldest token is more than K versions behind the trainer: `drop` it when
    it arrives (ledger: stale), `abort` it in the sampler as soon as it crosses the bound
    (ledger: aborted; arrivals still beyond K are dropped), or `keep` it and train on it with
    the importance-ratio correction of the loss (its lag then exceeds K)."""
    redundant: int = Field(0, ge=0)
    """r: start G + r samples of each group, keep the first G to finish and cancel the rest
    (RollArt). Cuts the wait for stragglers, costs the cancelled tokens (`tokens/cancelled`),
    and biases groups toward short completions: the G kept are the fastest, not a random G."""
    tail_pool: int = Field(4, ge=1)
    """tail_batching: prompts are drawn this many batches at a time and issued sorted by
    expected completion length, so short prompts share a batch and long ones another."""

    @model_validator(mode="after")
    def _known(self) -> ScheduleConfig:
        _check_name("schedule.name", self.name, PRESETS)
        return self

    @model_validator(mode="after")
    def _lag_allowed(self) -> ScheduleConfig:
        if self.max_lag is not None and self.name in PRESETS:
            try:
                PRESETS[self.name].with_max_lag(self.max_lag)
            except ValueError as e:
                raise ValueError(f"schedule.max_lag: {e}") from None
        return self


class RuntimeConfig(_Section):
    kind: Literal["inprocess", "local", "ray"] = "inprocess"
    """`inprocess`: the synchronous loop in one process (schedule `sync`; the other schedules
    always run on `local`). `local`: one trainer process and `num_samplers` sampler processes.
    `ray`: the same trainer and samplers as Ray actors, on this machine or a cluster."""
    address: str | None = None
    """Ray only: the cluster to join (`auto`: the one `ray start` runs on this node,
    `HOST:6379`, `ray://HOST:10001`). None starts a private Ray on this machine (all its cores,
    no dashboard, loopback only) and stops it after the run."""
    weight_transport: Literal["object_store", "broadcast"] = "object_store"
    """Ray only: how published weights reach the samplers. `object_store`: one `ray.put` per
    publish, each sampler fetches the latest when it loads. `broadcast`: a torch.distributed
    broadcast from the trainer (rank 0) to every sampler (gloo on CPU, NCCL with CUDA); the
    first weights, a restarted sampler and every publish after a sampler died go through the
    object store (a broadcast group cannot take a new member)."""
    call_timeout_s: float = Field(60.0, gt=0.0)
    """Ray only: the longest wait for any remote call beyond its own timeout (a queue put or
    get, a weight fetch, a sampler's answer to a ping); longer is an error naming the actor."""
    trainer_actor: bool = True
    """Ray only: host the trainer (orchestrator, model, optimizer, run folder writes) in a Ray
    actor, placed by `trainer_resources`, so the driver can be a laptop. False: the trainer
    runs in the driver process."""
    trainer_resources: dict[str, float] = Field(default_factory=dict)
    """Ray only: resources the trainer actor asks for (`{GPU = 1}`; `CPU`, `GPU`, custom).
    Empty: none, so it fits anywhere (on one machine)."""
    sampler_resources: dict[str, float] = Field(default_factory=dict)
    """Ray only: resources each sampler actor asks for; on a cluster, `{GPU = 1}` spreads the
    samplers one per GPU. Empty: none."""
    num_samplers: int = Field(1, ge=1)
    """Sampler processes (local runtime) or actors (Ray)."""
    threads_per_sampler: int = Field(0, ge=0)
    """torch threads in each sampler process; 0 splits the cores between the trainer and the
    samplers (at least 1 each)."""
    trainer_threads: int = Field(0, ge=0)
    """torch threads in the trainer process; 0 splits the cores as above."""
    sampler_slots: int = Field(0, ge=0)
    """Sequences each sampler's engine decodes at once; 0: B x (G + r)."""
    queue_size: int = Field(0, ge=0)
    """Bound of the queue of finished groups; 0: 2 x B. A full queue blocks the samplers."""
    poll_s: float = Field(0.05, gt=0.0, le=5.0)
    """Longest single wait on a queue; stop requests are noticed within it."""
    startup_timeout_s: float = Field(600.0, gt=0.0)
    """Samplers must be built and holding the first weights within this time."""
    stall_timeout_s: float = Field(600.0, gt=0.0)
    """Fail if no group arrives for this long while groups are in flight."""
    shutdown_timeout_s: float = Field(10.0, gt=0.0)
    """Wait this long for samplers to exit before terminating them."""
    max_restarts: int = Field(3, ge=0)
    """A sampler that dies (killed, crashed) is restarted with the latest weights at most this
    many times; its in-flight prompts are issued again and counted `lost` in the ledger."""
    sampler_timeout_s: float = Field(300.0, gt=0.0)
    """A sampler holding work that sends nothing (not even its counters, sent every 0.5 s
    while busy) for this long is killed and restarted."""
    chaos_kills: int = Field(0, ge=0)
    """Fault injection, to test recovery on your own setup: SIGKILL a random sampler (one that
    holds work, if any does) this many times during the run, one every `chaos_every_s` seconds
    (set `max_restarts` to match)."""
    chaos_every_s: float = Field(5.0, gt=0.0)
    """Seconds between injected sampler kills."""
    defer_eval: bool = False
    """Snapshot the weights at evaluation steps and evaluate them after the run, so that
    evaluation takes no time from training (benchmarks: time to a target accuracy)."""

    @model_validator(mode="after")
    def _resources(self) -> RuntimeConfig:
        for key in ("trainer_resources", "sampler_resources"):
            for name, amount in getattr(self, key).items():
                if amount < 0:
                    raise ValueError(f"{key}.{name}: must be >= 0, got {amount}")
        return self


class EvalConfig(_Section):
    every: int = Field(20, ge=1)
    """Greedy held-out accuracy every this many steps (and at the start and end)."""
    num_prompts: int = Field(256, ge=1)
    """Held-out prompts evaluated (at most the split's size)."""


class CheckpointConfig(_Section):
    every: int = Field(50, ge=1)
    """Save a checkpoint (HF folder + optimizer state) every this many steps and at the end."""
    keep: int = Field(2, ge=1)
    """Checkpoints kept; older ones are deleted."""


class WarmstartConfig(_Section):
    target_acc: float = Field(0.1, gt=0.0, lt=1.0)
    """Supervised warm start of the built-in model stops once held-out accuracy reaches this."""
    max_steps: int = Field(3000, ge=1)
    lr: float = Field(3e-3, gt=0.0, lt=1.0)
    batch_size: int = Field(64, ge=1)
    cache_dir: str | None = None
    """Where the warm-started model is cached; default ~/.cache/slipstream."""


class Config(_Section):
    """Everything a run needs. Sections mirror the TOML tables."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelSection = Field(default_factory=ModelSection)
    task: TaskConfig = Field(default_factory=TaskConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    filters: FilterConfig = Field(default_factory=FilterConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    warmstart: WarmstartConfig = Field(default_factory=WarmstartConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        if self.task.kind == "jsonl" and not self.task.path:
            raise ValueError("task.path: required when task.kind = 'jsonl'")
        if self.filters.pass_rate_low >= self.filters.pass_rate_high:
            raise ValueError("filters.pass_rate_low: must be below filters.pass_rate_high")
        return self

    @model_validator(mode="after")
    def _algorithms_consistent(self) -> Config:
        s, f = self.sampling, self.filters
        if s.adaptive_group_size and not s.group_size_min <= s.group_size <= s.group_size_max:
            raise ValueError(
                f"sampling.group_size_min: adaptive group size needs group_size_min <= group_size <= "
                f"group_size_max, got {s.group_size_min} <= {s.group_size} <= {s.group_size_max}"
            )
        if s.adaptive_group_size and s.group_size_min < 2 and self.trainer.advantage == "rloo":
            raise ValueError("sampling.group_size_min: rloo needs groups of at least 2")
        if f.dynamic_sampling and not f.zero_variance:
            raise ValueError(
                "filters.dynamic_sampling: needs filters.zero_variance = true (it refills dropped groups)"
            )
        if f.overlong == "penalty" and f.overlong_cache > s.max_new_tokens:
            raise ValueError(
                f"filters.overlong_cache: must be at most sampling.max_new_tokens ({s.max_new_tokens}), got {f.overlong_cache}"
            )
        return self


# ---- loading ------------------------------------------------------------------------------


def _all_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += _all_keys(ann, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def parse_value(text: str) -> Any:
    """A command-line value: TOML literal if it parses as one (3e-4, true, "x", [1, 2]), else text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(raw: dict[str, Any], item: str) -> None:
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key=value, e.g. trainer.lr=3e-4")
    key, _, value = item.partition("=")
    parts = key.strip().split(".")
    if not all(parts) or not is_text(key):
        raise ConfigError(
            f"override {item!r}: empty or not valid Unicode key; expected key=value, e.g. trainer.lr=3e-4"
        )
    node = raw
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key.strip()!r}: {p!r} is a value, not a section")
        node = child
    node[parts[-1]] = parse_value(value.strip())


def read_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    text = read_text(path, ConfigError)
    try:
        if path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
        raise ConfigError(
            f"{path}: not valid {path.suffix.lstrip('.').upper() or 'TOML'}: {str(e).splitlines()[0]}"
        ) from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to parse") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table of sections at the top level")
    _check_keys(data, path)
    return data


def _explain(err: ValidationError) -> str:
    e = err.errors()[0]
    key = ".".join(str(x) for x in e["loc"])
    if e["type"] == "extra_forbidden":
        near = difflib.get_close_matches(key, _all_keys(Config), n=1, cutoff=0.5)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        return f"unknown key {key!r}{hint}"
    msg = e["msg"].removeprefix("Value error, ")
    if not key or msg.startswith(f"{key}."):  # a model-level validator names the key itself
        return msg
    return f"{key}: {msg} (got {e.get('input')!r})"


def _check_keys(raw: dict[Any, Any], path: Path, prefix: str = "") -> None:
    """Empty keys, keys that are not text (a lone surrogate) and keys that are not strings at all
    (YAML reads `?`, `1:` or `true:` as None, 1, True): pydantic cannot name them."""
    for k, v in raw.items():
        name = f"{prefix}{k}"
        if not isinstance(k, str):
            raise ConfigError(
                f"{path}: key {name!r} is not text (read as {type(k).__name__}); quote it"
            )
        if not k or not is_text(k):
            raise ConfigError(f"{path}: key {name!r} is empty or not valid Unicode text")
        if isinstance(v, dict):
            _check_keys(v, path, f"{name}.")


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> Config:
    """Build a `Config` from an optional file and `key=value` overrides; raise `ConfigError`."""
    raw = read_file(path) if path else {}
    for item in overrides:
        apply_override(raw, item)
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_explain(err)) from None


def _drop_none(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _drop_none(v) for k, v in d.items() if v is not None}
    return d


def dump_config(cfg: Config) -> str:
    """The resolved config as TOML (None values, which TOML cannot hold, are left out)."""
    return tomli_w.dumps(_drop_none(cfg.model_dump()))
