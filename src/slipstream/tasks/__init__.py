"""Prompt sources and verifiers: the built-in task, JSONL datasets, user reward plugins."""

from slipstream.tasks.arithmetic import RunningSums
from slipstream.tasks.base import PromptSource, RewardFn, Task
from slipstream.tasks.guard import GuardedTask, RewardError, RewardGuard, Verdict
from slipstream.tasks.jsonl import JsonlTask, TaskError, load_reward, read_rows

__all__ = [
    "GuardedTask",
    "JsonlTask",
    "PromptSource",
    "RewardError",
    "RewardFn",
    "RewardGuard",
    "RunningSums",
    "Task",
    "TaskError",
    "Verdict",
    "load_reward",
    "read_rows",
]
