"""Prompt sources and verifiers: the built-in task, JSONL datasets, user reward plugins."""

from slipstream.tasks.arithmetic import RunningSums
from slipstream.tasks.base import PromptSource, RewardFn, Task
from slipstream.tasks.guard import GuardedTask, RewardError, RewardGuard, Verdict
from slipstream.tasks.jsonl import TaskError, load_reward
from slipstream.tasks.rows import DatasetTask, JsonlTask, RowFormat, read_prompts, read_rows

__all__ = [
    "DatasetTask",
    "GuardedTask",
    "JsonlTask",
    "PromptSource",
    "RewardError",
    "RewardFn",
    "RewardGuard",
    "RowFormat",
    "RunningSums",
    "Task",
    "TaskError",
    "Verdict",
    "load_reward",
    "read_prompts",
    "read_rows",
]
