"""math-verify rewards in threads other than the main one (where the Ray actors score), and
the deadline that bounds them there in place of math-verify's `signal.alarm`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from slipstream.tasks.deadline import call_with_deadline
from slipstream.tasks.jsonl import math_verify_reward
from slipstream.types import Prompt


def _in_thread(fn: Callable[[], object]) -> object:
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(_catch(fn)))
    t.start()
    t.join(30)
    assert not t.is_alive()
    return out[0]


def _catch(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except BaseException as e:
        return e


def test_math_verify_scores_in_a_thread_as_in_the_main_one():
    cases = [
        (Prompt("0", "2+2?", "4"), "The answer is $\\boxed{4}$", 1.0),
        (Prompt("0", "2+2?", "4"), "The answer is $\\boxed{5}$", 0.0),
        (Prompt("1", "half", "\\frac{1}{2}"), "$0.5$", 1.0),
    ]
    for prompt, completion, want in cases:
        assert math_verify_reward(prompt, completion) == want
        assert _in_thread(lambda p=prompt, c=completion: math_verify_reward(p, c)) == want


def test_a_deadline_stops_a_busy_loop_in_a_thread_and_nothing_fires_after():
    def spin() -> str:
        while True:
            pass

    t0 = time.monotonic()
    assert _in_thread(lambda: call_with_deadline(spin, 0.1, "late")) == "late"
    assert time.monotonic() - t0 < 5
    assert call_with_deadline(lambda: 3, 0.05, -1) == 3  # returned in time
    time.sleep(0.15)  # its watchdog was cancelled: no exception lands here later
    errors = _in_thread(lambda: call_with_deadline(lambda: 1 / 0, 1.0, None))
    assert isinstance(errors, ZeroDivisionError)  # the call's own exceptions propagate


def test_an_outer_deadline_is_not_swallowed_by_an_inner_one():
    def inner() -> str:
        return call_with_deadline(lambda: time.sleep(0.3) or "inner done", 10.0, "inner late")

    assert _in_thread(lambda: call_with_deadline(inner, 0.1, "outer late")) == "outer late"
