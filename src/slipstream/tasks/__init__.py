"""Prompt sources and verifiers: the built-in task, JSONL datasets, user reward plugins."""

from slipstream.tasks.arithmetic import RunningSums
from slipstream.tasks.base import PromptSource, RewardFn, Task
from slipstream.tasks.jsonl import JsonlTask, TaskError, load_reward, read_rows

__all__ = ["JsonlTask", "PromptSource", "RewardFn", "RunningSums", "Task", "TaskError", "load_reward", "read_rows"]
