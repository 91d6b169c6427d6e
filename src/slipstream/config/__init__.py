"""Typed, validated configuration: a TOML or YAML file plus dotted command-line overrides.

Every field is documented where it is declared. Loading rejects unknown keys (suggesting the
nearest valid one), wrong types and out-of-range values with a `ConfigError` whose message is
one line naming the key; the CLI turns it into exit code 2.
"""

from slipstream.config.base import ConfigError
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
from slipstream.config.load import (
    Config,
    _all_keys,
    apply_override,
    dump_config,
    load_config,
    parse_value,
    read_file,
)
from slipstream.config.system import CheckpointConfig, RunConfig, RuntimeConfig, ScheduleConfig
from slipstream.config.train import CorrectionConfig, FilterConfig, ReplayConfig, TrainerConfig
from slipstream.config.watchdog import WatchdogConfig

__all__ = [
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "CorrectionConfig",
    "EnvConfig",
    "EvalConfig",
    "FilterConfig",
    "ModelSection",
    "ReplayConfig",
    "RewardEntry",
    "RunConfig",
    "RuntimeConfig",
    "SamplingConfig",
    "ScheduleConfig",
    "TaskConfig",
    "TrainerConfig",
    "WandbConfig",
    "WarmstartConfig",
    "WatchdogConfig",
    "_all_keys",
    "apply_override",
    "dump_config",
    "load_config",
    "parse_value",
    "read_file",
]
