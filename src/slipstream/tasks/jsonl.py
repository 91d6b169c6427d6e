"""Reward functions by name (`math_verify`, `exact`, `module:function`, `file.py:function`) and
the error every bad task file or reward raises (datasets: tasks.datasets, tasks.rows)."""

from __future__ import annotations

import logging
import re

from slipstream.imports import load_object
from slipstream.tasks.base import RewardFn
from slipstream.tasks.deadline import call_with_deadline
from slipstream.types import Prompt


class TaskError(ValueError):
    """A bad task file or reward function: names the file and line, or the function."""


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

    gold: list[object] = []
    for text in _answer_forms(prompt.answer):
        gold = gold or parsed(text)
    pred = parsed(completion) if gold else []

    def same() -> bool:
        return bool(verify(gold, pred, timeout_seconds=None))

    if not pred:
        return 0.0
    return 1.0 if call_with_deadline(same, MATH_VERIFY_TIMEOUT_S, False) else 0.0


def _answer_forms(answer: str) -> tuple[str, str]:
    """The reference answer as math-verify should read it, first the likelier form: as given
    when it holds a math delimiter (an unescaped `$`; a LaTeX `\\$` is a dollar sign, as in
    MATH's money answers), else inside `$...$`; the other form if that one parses to nothing."""
    wrapped = f"${answer}$"
    return (answer, wrapped) if re.search(r"(?<!\\)\$", answer) else (wrapped, answer)


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
    what = f"reward {spec!r}"
    expected = f"{', '.join(BUILTIN_REWARDS)}, 'module:function' or 'file.py:function'"
    fn = load_object(spec, what, TaskError, expected, noun="function")
    assert callable(fn)
    return fn
