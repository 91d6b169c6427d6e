"""The whole `Config`, and loading it from a TOML or YAML file plus dotted overrides."""

from __future__ import annotations

import datetime as dt
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

import tomli_w
import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from slipstream.algo import losses
from slipstream.config import names
from slipstream.config.base import ConfigError, _Section
from slipstream.config.data import (
    EvalConfig,
    ModelSection,
    RewardEntry,
    SamplingConfig,
    TaskConfig,
    WandbConfig,
    WarmstartConfig,
)
from slipstream.config.env import EnvConfig
from slipstream.config.system import (
    CheckpointConfig,
    EngineConfig,
    RunConfig,
    RuntimeConfig,
    ScheduleConfig,
)
from slipstream.config.train import CorrectionConfig, FilterConfig, ReplayConfig, TrainerConfig
from slipstream.config.watchdog import WatchdogConfig
from slipstream.schedule.presets import preset
from slipstream.text import is_text, read_text

# what a `model.path` run takes where the built-in model's defaults differ: TRL GRPOConfig's
# learning_rate and max_completion_length (Config._pretrained_defaults)
PRETRAINED_DEFAULTS = (("trainer", "lr", 1e-6), ("sampling", "max_new_tokens", 256))


class Config(_Section):
    """Everything a run needs. Sections mirror the TOML tables."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelSection = Field(default_factory=ModelSection)
    task: TaskConfig = Field(default_factory=TaskConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig)
    filters: FilterConfig = Field(default_factory=FilterConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    warmstart: WarmstartConfig = Field(default_factory=WarmstartConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    watchdog: WatchdogConfig = Field(default_factory=WatchdogConfig)

    @model_validator(mode="before")
    @classmethod
    def _pretrained_defaults(cls, raw: object) -> object:
        """A model folder (`model.path`) takes TRL's GRPOConfig defaults where the built-in
        model's differ (`PRETRAINED_DEFAULTS`): the learning rate the 0.8M-parameter model
        trains from scratch with would wreck a pretrained one, and its 64-token completions cut
        reasoning short. A value given is kept; config.toml records the one used."""
        if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict):
            return raw
        if raw["model"].get("path") is None:
            return raw
        out = dict(raw)
        for section, key, value in PRETRAINED_DEFAULTS:
            table = out.get(section)
            if table is None or (isinstance(table, dict) and key not in table):
                out[section] = {**(table or {}), key: value}
        return out

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        if self.task.system_prompt and self.task.chat_template == "none":
            raise ValueError("task.system_prompt: needs a chat template (task.chat_template)")
        if self.task.chat_template_kwargs and self.task.chat_template == "none":
            raise ValueError(
                "task.chat_template_kwargs: needs a chat template (task.chat_template)"
            )
        if self.task.kind == "builtin_tools" and (self.env.tools or self.env.factory):
            key = "env.tools" if self.env.tools else "env.factory"
            raise ValueError(f"{key}: task.kind = 'builtin_tools' brings its own calculator")
        if self.filters.pass_rate_low >= self.filters.pass_rate_high:
            raise ValueError("filters.pass_rate_low: must be below filters.pass_rate_high")
        return self

    @property
    def runtime_kind(self) -> Literal["inprocess", "local", "ray"]:
        """The runtime that runs this config: `runtime.kind`, except that only the `sync`
        schedule runs in process; any other schedule asked for `inprocess` (the default)
        runs on `local`, with `runtime.num_samplers` sampler processes."""
        kind = self.runtime.kind
        return "local" if kind == "inprocess" and self.schedule.name != "sync" else kind

    @model_validator(mode="after")
    def _recordable(self) -> Config:
        """run.record_schedule needs a run `slipstream replay` can re-execute (schedule.record)."""
        if not self.run.record_schedule:
            return self
        if self.runtime_kind == "inprocess":
            raise ValueError(
                "run.record_schedule: the in-process sync loop has no schedule to record (it is "
                "deterministic as it is); use runtime.kind = 'local'"
            )
        if self.env.tools or self.env.factory or self.task.kind == "builtin_tools":
            raise ValueError("run.record_schedule: multi-turn environments cannot be replayed yet")
        if self.runtime.chaos_kills:
            raise ValueError(
                "run.record_schedule: a run with runtime.chaos_kills cannot be replayed"
            )
        return self

    @model_validator(mode="after")
    def _min_lag_untightened(self) -> Config:
        """The watchdog's `tighten` sets K = 0, below a `schedule.min_lag` of 1 or more: no
        window could then take a group old enough, and the run would stall."""
        w = self.watchdog
        if self.schedule.min_lag and w.enabled and "tighten" in w.actions.values():
            raise ValueError(
                f"schedule.min_lag: {self.schedule.min_lag} with a watchdog action 'tighten' "
                "(K = 0) would leave no window a group old enough; use 'warn' or 'rollback'"
            )
        return self

    @model_validator(mode="after")
    def _orchestrated_only(self) -> Config:
        """Settings of the orchestrated runtimes: the in-process sync loop (the default) has no
        sampler processes and evaluates as it goes, and would run without a word one
        sampler, no kills and evaluation in line."""
        if self.runtime_kind != "inprocess":
            return self
        no_samplers = "the in-process sync loop has no sampler processes"
        for key, value, why in (
            ("num_samplers", self.runtime.num_samplers > 1, no_samplers),
            ("chaos_kills", self.runtime.chaos_kills > 0, no_samplers),
            ("defer_eval", self.runtime.defer_eval, "the in-process sync loop evaluates in line"),
        ):
            if value:
                raise ValueError(f"runtime.{key}: {why}; use runtime.kind = 'local' (or 'ray')")
        return self

    @model_validator(mode="after")
    def _refill_off_in_process(self) -> Config:
        """`filters.pass_rate_refill = false` is a rule of the in-process sync loop's draw: the
        orchestrated schedules issue prompts until a step holds B groups, which refills, and
        would run as if it were true without a word."""
        if self.filters.pass_rate_refill or self.runtime_kind == "inprocess":
            return self
        raise ValueError(
            "filters.pass_rate_refill: false is honoured only by the in-process sync loop "
            "(schedule.name = 'sync', runtime.kind = 'inprocess'); the other schedules and "
            "runtimes issue prompts until a step holds B groups, which refills"
        )

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
        if self.trainer.advantage == "maxrl" and f.overlong == "penalty":
            raise ValueError(
                "trainer.advantage: maxrl is defined for rewards in [0, 1], and "
                "filters.overlong = 'penalty' makes them negative; use overlong = 'mask' or "
                "another advantage"
            )
        if self.trainer.advantage == "maxrl" and any(r.weight < 0 for r in self.task.rewards):
            raise ValueError(
                "trainer.advantage: maxrl is defined for rewards in [0, 1], and a negative "
                "weight in task.rewards makes them negative"
            )
        if self.trainer.advantage == "rloo" and s.group_size < 2:
            raise ValueError("sampling.group_size: rloo needs groups of at least 2")
        if f.overlong == "penalty" and (
            self.env.tools or self.env.factory or self.task.kind == "builtin_tools"
        ):
            raise ValueError(
                "filters.overlong: 'penalty' weighs one completion's length against "
                "sampling.max_new_tokens, a cap on one turn, while an episode counts every turn "
                "and the environment's tokens; use overlong = 'mask' or 'off'"
            )
        self._truncated_behavior_paired()
        if f.overlong == "penalty" and f.overlong_cache > s.max_new_tokens:
            raise ValueError(
                f"filters.overlong_cache: must be at most sampling.max_new_tokens ({s.max_new_tokens}), got {f.overlong_cache}"
            )
        return self

    def _truncated_behavior_paired(self) -> None:
        """`behavior_logprobs = "truncated"` reads `pi / mu` = Z < 1 on-policy: as the clipped
        trust-region ratio (proximal `none`, `loglinear`) that cuts the gradient of every token
        whose kept mass is below 1 - eps_low; only `recompute` makes it a detached weight,
        which `auto` picks on fresh data (train.trainer.resolve_proximal)."""
        t = self.trainer
        if not truncated_behavior(self) or t.proximal == "recompute":
            return
        stale = (
            self.replay.enabled or preset(self.schedule.name, self.schedule.lag_bound).max_lag > 0
        )
        if t.proximal != "auto" or stale:
            why = f"proximal = {t.proximal!r}" + (" on data that can be stale" if stale else "")
            raise ValueError(
                f"trainer.behavior_logprobs: 'truncated' with {why} makes the clipped ratio "
                "read the kept mass Z < 1 on-policy; set trainer.proximal = 'recompute' "
                "(no trust region on stale data: bench/staleness.py) or behavior_logprobs = "
                "'full'"
            )

    @model_validator(mode="after")
    def _resolve_agg(self) -> Config:
        # the built-in task's own choice (config/train.py, trainer.agg); else the loss's default
        if self.trainer.agg is None:
            builtin = self.task.kind == "builtin"
            agg = "seq-mean-token-mean" if builtin else losses.METHODS[self.trainer.loss].agg
            object.__setattr__(self.trainer, "agg", agg)
        return self


def truncated_behavior(cfg: Config) -> bool:
    """The behaviour log-probs are those of a truncated distribution: `behavior_logprobs =
    "truncated"` and a sampler that truncates (top-k, top-p)."""
    s = cfg.sampling
    return cfg.trainer.behavior_logprobs == "truncated" and (s.top_k > 0 or s.top_p < 1.0)


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
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    # no setting is a date: `run.dir=2024-01-01` is a folder's name
    return text if isinstance(value, dt.date | dt.time) else value


def apply_override(raw: dict[str, Any], item: str) -> None:
    if "=" not in item:
        where = (
            "; a config file goes first (or --config FILE)"
            if item.endswith((".toml", ".yaml", ".yml"))
            else ""
        )
        raise ConfigError(f"override {item!r}: expected key=value, e.g. trainer.lr=3e-4{where}")
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
    if not value.strip():  # `run.dir=` is a mistake, not a request for the default
        raise ConfigError(
            f"override {item!r}: empty value; give one, or leave {key.strip()!r} out for its "
            'default (an empty string is "")'
        )
    node[parts[-1]] = parse_value(value.strip())


def read_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    text = read_text(path, ConfigError)
    yml = path.suffix in (".yaml", ".yml")
    try:
        data = (yaml.safe_load(text) or {}) if yml else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
        kind = "YAML" if yml else "TOML"
        if path.suffix not in ("", ".toml", ".yaml", ".yml"):  # run.json is read as TOML
            kind += " (a config file is TOML or YAML)"
        raise ConfigError(f"{path}: not valid {kind}: {str(e).splitlines()[0]}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to parse") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table of sections at the top level")
    _check_keys(data, path)
    return data


def _explain(err: ValidationError) -> str:
    e = err.errors()[0]
    if e["type"] == "extra_forbidden":
        key = _entry_key(e["loc"])
        got = e.get("input")
        while isinstance(got, dict) and len(got) == 1:  # an unknown section: the key given
            ((k, got),) = got.items()
            key = f"{key}.{k}"
        if re.search(r"\[\d+\]", key):  # a list entry's field: `task.rewards[0].fn`
            fields = [f"{key.rsplit('.', 1)[0]}.{f}" for f in RewardEntry.model_fields]
            return f"unknown key {key!r}{names.hint(key, fields)}"
        return f"unknown key {key!r}{names.hint(key, _all_keys(Config))}"
    key = _key_of(e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    if not key or msg.startswith(f"{key}."):  # a model-level validator names the key itself
        return msg
    got = e.get("input")
    hint = ""
    if e["type"] == "string_type" and isinstance(got, int | float | bool):
        hint = f"; a text that reads as a number or boolean needs quotes: {key}='\"{got}\"'"
    return f"{key}: {msg} (got {got!r}){hint}"


def _entry_key(loc: tuple[int | str, ...]) -> str:
    """`task.rewards[0].fun` for the location ('task', 'rewards', 0, 'fun')."""
    out = ""
    for x in loc:
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out


def _key_of(loc: tuple[int | str, ...]) -> str:
    """The dotted setting of a validation error's location, without what pydantic appends for
    a union's member (`schedule.max_lag.int`, `...sampler_devices.literal['auto']`)."""
    keys = _all_keys(Config)
    parts: list[str] = []
    for i, x in enumerate(map(str, loc)):
        name = ".".join([*parts, x])
        if name not in keys and not any(k.startswith(f"{name}.") for k in keys):
            if isinstance(loc[i], int) and len(loc) > i + 1:  # a list entry's field
                return _entry_key(loc[: i + 2])
            break
        parts.append(x)
    return ".".join(parts) or ".".join(map(str, loc))


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
    if isinstance(d, list):  # an array of tables (task.rewards)
        return [_drop_none(v) for v in d]
    return d


def dump_config(cfg: Config) -> str:
    """The resolved config as TOML (None values, which TOML cannot hold, are left out)."""
    return tomli_w.dumps(_drop_none(cfg.model_dump()))
