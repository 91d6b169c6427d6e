"""The reward guard: a verifier that raises, hangs, crashes or returns a non-number costs one
sample, not the run.

`RewardGuard.score(prompt, completions)` gives one `Verdict` per completion. Every way a reward
call can fail becomes reward 0.0 with the kind of failure (`ERRORS`), counted in `errors`:

- `raised`: the function raised an exception;
- `invalid`: it returned NaN, an infinity or something that is not a number (a string, None);
- `timeout`: it gave no result within `timeout_s` (process isolation only);
- `crashed`: its worker process died (a segfault, `os._exit`) while scoring the sample.

With `on_error="fail"` the first failure raises `RewardError` instead, naming the reward, the
prompt and what happened.

Isolation `inline` calls the function in the caller: no IPC, no timeout; for trusted verifiers
(the built-in task, `exact`, `math_verify`). Isolation `process` runs it in a worker subprocess
that imports neither torch nor the caller's state. A group is one round trip: the worker scores
its completions in order and streams each result back, and each result has its own timeout.
A sample past the timeout gets its worker killed (SIGKILL also stops a busy loop in C), and
the rest of the group goes to a fresh worker, so a hang in sample k loses only sample k; a worker
that dies is replaced the same way. The first call in each worker process may take up to
`startup_timeout_s` like the worker's import, since a reward that imports or connects on its
first call pays that again in every fresh worker (with `timeout_s` alone, every sample would
time out); once a first call runs past even that, first calls get `timeout_s` too. The worker
is a plain subprocess, not a multiprocessing child, so the daemonic sampler processes can host
one; it is killed on `close`, at exit and, on Linux, when its parent dies (PR_SET_PDEATHSIG);
elsewhere it exits at EOF on its pipe.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import signal
import subprocess
import sys
import threading
import warnings
import weakref
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal

from slipstream.parent import die_with_parent
from slipstream.tasks.base import RewardFn, Task
from slipstream.tasks.jsonl import TaskError
from slipstream.tasks.rewards import resolve
from slipstream.text import clip, short_repr
from slipstream.types import Prompt

ERRORS = ("raised", "invalid", "timeout", "crashed")
STARTUP_TIMEOUT_S = 120.0  # a worker's import of the reward module (sympy, transformers...)
KILL_WAIT_S = 5.0  # reaping a SIGKILLed worker; only a process stuck in the kernel takes longer

Isolation = Literal["inline", "process"]
OnError = Literal["zero", "fail"]


class RewardError(TaskError):
    """A reward function failed on a sample and `task.reward_errors` is `fail`, or its worker
    process cannot be started."""


@dataclass(frozen=True)
class Verdict:
    """The outcome of one reward call: the reward, or 0.0 with why (`error` in `ERRORS`)."""

    reward: float
    error: str = ""
    detail: str = ""  # what happened, for messages: "raised ValueError: bad input"
    # the numbers a dict-valued reward returned besides its `score` (tasks.rewards), by name
    parts: dict[str, float] = field(default_factory=dict)


class RewardGuard:
    """Scores completions with `reward` (a function, or a `load_reward` spec such as
    `rewards.py:score`) and turns its failures into counted zeros (module docstring).

    Callable like the reward function itself: `guard(prompt, completion) -> float`. Not for
    concurrent use from several threads (a lock serialises calls).
    """

    def __init__(
        self,
        reward: RewardFn | str,
        isolation: Isolation = "inline",
        timeout_s: float = 10.0,
        on_error: OnError = "zero",
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> None:
        if isolation not in ("inline", "process") or on_error not in ("zero", "fail"):
            raise ValueError(f"isolation {isolation!r}, on_error {on_error!r}")
        self.name = (
            reward if isinstance(reward, str) else getattr(reward, "__qualname__", repr(reward))
        )
        self.isolation, self.timeout_s, self.on_error = isolation, timeout_s, on_error
        self.errors: Counter[str] = Counter()
        self._fn: RewardFn | None = None
        self._worker: _Worker | None = None
        if isolation == "inline":
            self._fn = resolve(reward)
        else:  # started now, so a reward that cannot be loaded fails the build, not step 1
            self._worker = _Worker(reward, self.name, startup_timeout_s)

    def __call__(self, prompt: Prompt, completion: str) -> float:
        return self.score(prompt, [completion])[0].reward

    def score(self, prompt: Prompt, completions: list[str]) -> list[Verdict]:
        """One verdict per completion, in order; counts failures (or raises, with `fail`)."""
        if self._fn is not None:
            out = [_verdict(*_call(self._fn, prompt, c, _INLINE_RAISES)) for c in completions]
        else:
            assert self._worker is not None
            out = self._worker.score(prompt, completions, self.timeout_s, self.on_error == "fail")
        for v in out:
            if v.error:
                self._failed(prompt, v)
        return out

    def _failed(self, prompt: Prompt, v: Verdict) -> None:
        self.errors[v.error] += 1
        msg = f"reward {self.name!r} on prompt {prompt.id!r}: {v.detail}"
        if self.on_error == "fail":
            raise RewardError(f"{msg} (task.reward_errors = 'fail')")
        if self.errors[v.error] == 1:  # deliberate fault tolerance: said once, counted always
            warnings.warn(
                f"{msg}; scored 0. Further such errors are only counted (reward/errors_{v.error})",
                RuntimeWarning,
                stacklevel=3,
            )

    def close(self) -> None:
        """Stop the worker process, if any (also done at exit)."""
        if self._worker is not None:
            self._worker.close()


class GuardedTask:
    """A task whose verifier runs behind a `RewardGuard`; what `build_task` returns."""

    def __init__(self, task: Task, guard: RewardGuard) -> None:
        self.task, self.guard, self.name = task, guard, task.name

    def train_prompts(self) -> list[Prompt]:
        return self.task.train_prompts()

    def heldout_prompts(self) -> list[Prompt]:
        return self.task.heldout_prompts()

    def reward(self, prompt: Prompt, completion: str) -> float:
        return self.guard(prompt, completion)

    def score(self, prompt: Prompt, completions: list[str]) -> list[Verdict]:
        return self.guard.score(prompt, completions)

    @property
    def errors(self) -> Counter[str]:
        return self.guard.errors

    def close(self) -> None:
        self.guard.close()


def score_completions(task: Task, prompt: Prompt, completions: list[str]) -> list[Verdict]:
    """Verdicts of a group: through the guard of a `GuardedTask` (one round trip), else plain
    `task.reward` calls whose exceptions propagate."""
    if isinstance(task, GuardedTask):
        return task.score(prompt, completions)
    return [Verdict(float(task.reward(prompt, c))) for c in completions]


def unguarded(task: Task) -> Task:
    return task.task if isinstance(task, GuardedTask) else task


# ---- one call, in the caller or in the worker -------------------------------------------------
# what counts as a reward raising inline: `sys.exit()` in a reward too (it would end the run,
# with status 0 for `sys.exit()`), but not Ctrl-C
_INLINE_RAISES = (Exception, SystemExit)


def _call(
    fn: RewardFn,
    prompt: Prompt,
    completion: str,
    catch: type[BaseException] | tuple[type[BaseException], ...],
) -> tuple[float, str, str, dict[str, float]]:
    """`(reward, error, detail, parts)` of one call; `catch` is what counts as the function
    raising. A dict's `score` is the reward, its other finite numbers the parts."""
    try:
        value = fn(prompt, completion)
    except catch as e:
        return 0.0, "raised", f"raised {_describe(e)}", {}
    if type(value) is float and value - value == 0.0:  # the common case; nan - nan is nan
        return value, "", "", {}
    parts: dict[str, float] = {}
    returned = value
    if isinstance(value, dict):
        parts = {k: float(v) for k, v in value.items() if k != "score" and _finite(v)}
        value = value.get("score")
    x = as_reward(value)
    if x is not None:
        return x, "", "", parts
    what = "a finite number" if returned is value else "a finite number as its 'score'"
    return (
        0.0,
        "invalid",
        f"returned {short_repr(returned)} ({type(returned).__name__}), not {what}",
        {},
    )


def as_reward(value: object) -> float | None:
    """`value` as a finite float: anything `float()` takes but text (numpy and torch scalars
    included); None for NaN, an infinity, None, a string or another object."""
    if isinstance(value, str | bytes):
        return None
    try:
        x = float(value)  # type: ignore[arg-type]
    except Exception:  # a user type's __float__ may raise anything
        return None
    return x if math.isfinite(x) else None


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _verdict(reward: float, error: str, detail: str, parts: dict[str, float]) -> Verdict:
    return Verdict(reward, error, detail) if error else Verdict(reward, parts=parts)


def _describe(e: BaseException) -> str:
    try:
        text = str(e).strip().splitlines()
    except Exception:
        text = []
    return f"{type(e).__name__}: {clip(text[0])}" if text else type(e).__name__


# ---- the worker process ---------------------------------------------------------------------
_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the slipstream package
_BOOT = (
    f"import sys; sys.path.insert(0, {_ROOT!r}); from slipstream.tasks.guard import _serve; "
    "_serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))"
)


class _Worker:
    """One reward worker subprocess and its two pipes; replaced after a kill or a crash."""

    def __init__(self, target: RewardFn | str, name: str, startup_timeout_s: float) -> None:
        self.name, self.startup_timeout_s = name, startup_timeout_s
        try:
            self.payload = pickle.dumps((list(sys.path), target))
        except Exception as e:
            raise TaskError(
                f"reward {name!r} cannot be sent to a worker process ({_describe(e)}): give it as "
                "'module:function' or 'file.py:function', or set task.reward_isolation = 'inline'"
            ) from None
        self.proc: subprocess.Popen[bytes] | None = None
        self.tx: Connection | None = None
        self.rx: Connection | None = None
        self.starts = 0
        self.warm = False  # this process has returned a result: its first call is behind it
        self.grace = True  # a first call may take startup_timeout_s, till one runs past it
        self._lock = threading.Lock()
        self._live: list[Any] = []  # [proc, tx, rx] of the running worker, for the finalizer
        self._finalizer = weakref.finalize(self, _stop, self._live)
        self._start()

    def _start(self) -> None:
        r_in, w_in = os.pipe()  # parent -> worker
        r_out, w_out = os.pipe()  # worker -> parent
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(r_in), str(w_out), str(os.getpid())],
                pass_fds=(r_in, w_out),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            for fd in (w_in, r_out):
                os.close(fd)
            raise
        finally:
            os.close(r_in)
            os.close(w_out)
        self.proc, self.tx, self.rx = (
            proc,
            Connection(w_in, readable=False),
            Connection(r_out, writable=False),
        )
        self._live[:] = [proc, self.tx, self.rx]
        self.starts += 1
        self.warm = False
        try:
            self.tx.send_bytes(self.payload)
            if not self.rx.poll(self.startup_timeout_s):
                raise RewardError(
                    f"reward {self.name!r}: its worker process did not start within {self.startup_timeout_s:g} s"
                )
            kind, detail = self.rx.recv()
        except (EOFError, OSError):
            status = self._exit_status()
            self.kill()
            raise RewardError(
                f"reward {self.name!r}: its worker process {status} while starting"
            ) from None
        except BaseException:
            self.kill()
            raise
        if kind != "ready":
            self.kill()
            raise TaskError(detail)

    def score(
        self, prompt: Prompt, completions: list[str], timeout_s: float, stop_at_error: bool
    ) -> list[Verdict]:
        """Verdicts in order; a timeout or a crash costs its own sample and a fresh worker."""
        with self._lock:
            out: list[Verdict] = []
            while len(out) < len(completions):
                if self.proc is None or self.proc.poll() is not None:
                    self._start()  # killed or died between requests: not this group's fault
                n = len(out)
                try:
                    self._round_trip(prompt, completions[n:], timeout_s, stop_at_error, out)
                except BaseException:  # interrupted mid-request: results would arrive out of turn
                    self.kill()
                    raise
                if stop_at_error and any(v.error for v in out):
                    break
            return out

    def _round_trip(
        self,
        prompt: Prompt,
        rest: list[str],
        timeout_s: float,
        stop_at_error: bool,
        out: list[Verdict],
    ) -> None:
        """Send `rest`, append its verdicts to `out` until they are all in or one fails."""
        assert self.tx is not None and self.rx is not None
        try:
            self.tx.send((prompt, rest))
        except OSError:  # died just now: charge the sample it was about to score
            out.append(Verdict(0.0, "crashed", f"its worker process {self._exit_status()}"))
            return
        for _ in rest:
            first = not self.warm and self.grace
            bound = max(timeout_s, self.startup_timeout_s) if first else timeout_s
            if not self.rx.poll(bound):
                self.kill()
                self.grace = self.grace and not first  # it hangs, not imports: no more grace
                why = "its first call in a fresh worker" if first else "task.reward_timeout_s"
                out.append(
                    Verdict(
                        0.0,
                        "timeout",
                        f"no result within {bound:g} s ({why}); its worker process was killed",
                    )
                )
                return
            self.warm = True
            try:
                v = _verdict(*self.rx.recv())
            except (EOFError, OSError):
                out.append(Verdict(0.0, "crashed", f"its worker process {self._exit_status()}"))
                self.kill()
                return
            out.append(v)
            if v.error and stop_at_error:
                self.kill()  # the rest of the group is still streaming in
                return

    def _exit_status(self) -> str:
        if self.proc is None:
            return "is gone"
        try:
            code = self.proc.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code < 0:
            try:
                return f"died of {signal.Signals(-code).name}"
            except ValueError:
                return f"died of signal {-code}"
        return f"exited with code {code}"

    def kill(self) -> None:
        _stop(self._live)
        self.proc = self.tx = self.rx = None

    def close(self) -> None:
        self._finalizer()


def _stop(live: list[Any]) -> None:
    """Kill and reap a worker (`[proc, tx, rx]`), close its pipes; `live` is emptied."""
    if not live:
        return
    proc, tx, rx = live
    live.clear()
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel: leave it
        proc.wait(KILL_WAIT_S)
    tx.close()
    rx.close()


def _serve(r_fd: int, w_fd: int, parent_pid: int) -> None:
    """The worker's main: load the reward, then score `(prompt, completions)` requests, sending
    `(reward, error, detail)` per completion, until its pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's; it kills the worker
    die_with_parent(parent_pid)
    rx, tx = Connection(r_fd, writable=False), Connection(w_fd, readable=False)
    target: Any = None
    try:
        path, target = pickle.loads(rx.recv_bytes())
        sys.path[:] = path
        fn = resolve(target)
    except TaskError as e:
        tx.send(("error", str(e)))
        return
    except BaseException as e:  # the module itself fails to import: a load error, not a crash
        tx.send(("error", f"reward {target!r}: loading it raised {_describe(e)}"))
        return
    tx.send(("ready", ""))
    while True:
        try:
            prompt, completions = rx.recv()
        except EOFError:
            return
        for c in completions:
            tx.send(_call(fn, prompt, c, BaseException))  # sys.exit() in a reward is a raise
