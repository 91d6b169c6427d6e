"""User tasks: a JSONL file of {"prompt": ..., "answer": ...} rows, and reward functions."""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slipstream.tasks.base import RewardFn
from slipstream.tasks.deadline import call_with_deadline
from slipstream.text import is_text, read_text
from slipstream.types import Prompt


class TaskError(ValueError):
    """A bad task file or reward function: names the file and line, or the function."""


def read_rows(path: str | Path, template: str = "{prompt}") -> list[Prompt]:
    """Prompts from a JSONL file; a malformed row raises `TaskError` naming file and line."""
    path = Path(path)
    if not path.exists():
        raise TaskError(f"{path}: no such file")
    prompts = []
    text = read_text(path, TaskError)
    # JSONL rows end at "\n" only: str.splitlines() would also split at U+2028, U+0085 and
    # other characters that are legal inside a JSON string, and miscount the lines
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        except (ValueError, RecursionError) as e:  # an integer over 4300 digits, deep nesting
            msg = "nested too deeply" if isinstance(e, RecursionError) else str(e).splitlines()[0]
            raise TaskError(f"{path}:{n}: not valid JSON ({msg})") from None
        if not isinstance(row, dict):
            raise TaskError(f"{path}:{n}: expected a JSON object with 'prompt' and 'answer'")
        for key in ("prompt", "answer"):
            if key not in row:
                raise TaskError(f"{path}:{n}: missing field {key!r}")
        if not isinstance(row["prompt"], str) or not row["prompt"]:
            raise TaskError(f"{path}:{n}: 'prompt' must be a non-empty string")
        if not isinstance(row["answer"], str | int | float):
            raise TaskError(f"{path}:{n}: 'answer' must be a string or a number")
        pid = str(row.get("id", f"{path.stem}:{n}"))
        if not is_text(row["prompt"] + str(row["answer"]) + pid):
            raise TaskError(
                f"{path}:{n}: a lone surrogate (\\ud800-\\udfff) is not text a tokenizer can take"
            )
        prompts.append(
            Prompt(
                id=pid, text=template.replace("{prompt}", row["prompt"]), answer=str(row["answer"])
            )
        )
    if not prompts:
        raise TaskError(f"{path}: no rows")
    return prompts


MATH_VERIFY_TIMEOUT_S = 5.0  # per parse and per comparison, math-verify's own defaults


def math_verify_reward(prompt: Prompt, completion: str) -> float:
    """1.0 when math-verify finds the completion's final answer equal to the reference.

    math-verify's own timeouts use `signal.alarm`, which raises outside the main thread (the
    Ray actors score in threads), so they are off and `call_with_deadline` bounds each parse
    and the comparison instead; past the bound a call counts as math-verify's own timeout
    does: no answer found, or not equal (reward 0)."""
    from math_verify import parse, verify

    _quiet_math_verify()

    def parsed(text: str) -> list[object]:
        return call_with_deadline(lambda: parse(text, parsing_timeout=0), MATH_VERIFY_TIMEOUT_S, [])

    gold = parsed(prompt.answer if "$" in prompt.answer else f"${prompt.answer}$")
    pred = parsed(completion) if gold else []

    def same() -> bool:
        return bool(verify(gold, pred, timeout_seconds=None))

    return 1.0 if pred and call_with_deadline(same, MATH_VERIFY_TIMEOUT_S, False) else 0.0


def _drop_timeout_warning(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Timeout is disabled")


def _quiet_math_verify() -> None:
    """math-verify warns once that its timeout is off; here it is bounded by the caller."""
    for name in ("math_verify.parser", "math_verify.grader"):
        log = logging.getLogger(name)
        if _drop_timeout_warning not in log.filters:
            log.addFilter(_drop_timeout_warning)


def exact_reward(prompt: Prompt, completion: str) -> float:
    return 1.0 if completion.strip() == str(prompt.answer).strip() else 0.0


BUILTIN_REWARDS: dict[str, RewardFn] = {"math_verify": math_verify_reward, "exact": exact_reward}


def load_reward(spec: str) -> RewardFn:
    """`math_verify`, `exact`, `package.module:function` or `path/to/file.py:function`."""
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise TaskError(
            f"reward {spec!r}: expected {', '.join(BUILTIN_REWARDS)}, 'module:function' or 'file.py:function'"
        )
    if target.endswith(".py"):
        file = Path(target)
        if not file.exists():
            raise TaskError(f"reward {spec!r}: no such file {file}")
        mod_spec = importlib.util.spec_from_file_location(file.stem, file)
        assert mod_spec is not None and mod_spec.loader is not None
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise TaskError(f"reward {spec!r}: cannot import {target!r} ({e})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise TaskError(f"reward {spec!r}: {target} has no function {name!r}")
    return fn


@dataclass
class JsonlTask:
    """Training rows from a JSONL file; held out from a second file or a seeded split."""

    path: str
    reward_fn: Callable[[Prompt, str], float]
    heldout_path: str | None = None
    heldout_fraction: float = 0.1
    template: str = "{prompt}"
    seed: int = 0
    name: str = "jsonl"

    def __post_init__(self) -> None:
        rows = read_rows(self.path, self.template)
        if self.heldout_path:
            self._train, self._heldout = rows, read_rows(self.heldout_path, self.template)
        else:
            order = list(range(len(rows)))
            random.Random(self.seed).shuffle(order)
            n_held = int(len(rows) * self.heldout_fraction)
            held = set(order[:n_held])
            self._heldout = [r for i, r in enumerate(rows) if i in held]
            self._train = [r for i, r in enumerate(rows) if i not in held]
        if not self._train:
            raise TaskError(f"{self.path}: no training rows left after the held-out split")

    def train_prompts(self) -> list[Prompt]:
        return self._train

    def heldout_prompts(self) -> list[Prompt]:
        return self._heldout

    def reward(self, prompt: Prompt, completion: str) -> float:
        return float(self.reward_fn(prompt, completion))
