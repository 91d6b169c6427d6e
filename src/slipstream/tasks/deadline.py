"""A time bound on a pure-Python call that works in any thread.

`signal.alarm`, which math-verify uses for its own timeouts, works only in the main thread of
the main interpreter; the Ray sampler and trainer actors call rewards in other threads, where
math-verify's timeout raises `ValueError` instead of scoring. `call_with_deadline` bounds a
call in whatever thread makes it: a watchdog timer raises `DeadlineExceeded` in that thread
(`PyThreadState_SetAsyncExc`) when the bound passes. Like a signal handler, the exception is
raised between two bytecodes, so it stops Python code (sympy's parsing and simplification),
not a single long call into C. It derives from `BaseException` so that the `except Exception`
blocks of the code it interrupts (math-verify has several) do not swallow it.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc  # (thread id, exception or NULL)


class DeadlineExceeded(BaseException):
    """Raised in a thread whose `call_with_deadline` ran past its bound."""


def call_with_deadline(fn: Callable[[], T], timeout_s: float, on_timeout: T) -> T:
    """`fn()`, or `on_timeout` when it has not returned within `timeout_s` seconds.

    Exceptions of `fn` propagate. The watchdog is cancelled under a lock before this returns,
    and an exception it had already set but that had not been raised yet is cleared, so the
    bound never fires in the caller's code after the call."""
    tid = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False, "fired": False}

    def fire() -> None:
        with lock:
            if not state["done"]:
                state["fired"] = True
                _set_async_exc(ctypes.c_ulong(tid), ctypes.py_object(DeadlineExceeded))

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    try:
        try:
            timer.start()
            return fn()
        finally:
            with lock:
                state["done"] = True
                if state["fired"]:
                    _set_async_exc(ctypes.c_ulong(tid), None)  # NULL clears one still pending
            timer.cancel()
    except DeadlineExceeded:
        if not state["fired"]:  # someone else's: not ours to swallow
            raise
        return on_timeout
