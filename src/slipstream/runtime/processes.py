"""How the library starts its worker processes (samplers, environment workers): from a fork
server that imported torch and the workers' modules once.

`spawn` starts a clean interpreter per process, which then imports torch and the library
again: 2.5 to 4 s of CPU on this repository's 2-core machine, paid at every start and at every
restart of a crashed sampler. A fork server (`multiprocessing`'s `forkserver`) is such a clean
interpreter started once per parent process; it imports `PRELOAD` and does nothing else (no
torch op runs in it, so no thread pool or lock exists to be forked), and each new process is a
fork of it: started in milliseconds, with the same isolation from the parent as `spawn` (no
memory of the parent's, nothing of its CUDA state). A worker sets its own environment
(`CUDA_VISIBLE_DEVICES`, thread counts) in its entry function, before anything touches CUDA:
the fork server's environment is the parent's when it started, not at each start.

A fresh process that exits by itself (an exit code above 0) before its first sign of life
failed in that preparation, nearly always because the main module cannot be imported again (a
script that starts its run outside `if __name__ == "__main__":` starts it again in the child,
which multiprocessing forbids): each replacement would die the same way. `StartFailures`
counts them for the environment workers and the samplers alike; `START_FAILURES` in a row
stop the run with `WorkersCannotStart`, naming the guard (`MAIN_GUARD`).

`start(process)` starts one. Like `spawn`, a fork-server child imports the parent's main
module again when it has a file; a script read from stdin (`python - <<EOF`) names `<stdin>`,
which a child cannot find, and every child died with `FileNotFoundError` before running. `start`
hides such a `__file__` while the child is prepared: the library's workers need nothing from
the main module (what a child needs of it must be importable, as under `spawn`).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
from collections.abc import Iterator
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess

PRELOAD = ["torch", "slipstream.run.sampler", "slipstream.envs", "slipstream.run.agentic"]
"""Imported once by the fork server: what a sampler and an environment worker import (the
sampler's factory and its loop, the environments and their factories)."""


START_FAILURES = 3  # fresh processes in a row that exit (not killed) before any sign of life
MAIN_GUARD = (  # what `WorkersCannotStart` says of them, after "They are" / "Samplers are"
    "forked from a fork server that imports the main module again: check that the training "
    'script runs its work under `if __name__ == "__main__":`'
)


class WorkersCannotStart(RuntimeError):
    """Worker processes (environment workers, samplers) exit before their first sign of life,
    again and again (each fresh one would die the same way: the run stops instead of
    churning)."""


class StartFailures:
    """Fresh processes in a row that exited by themselves (an exit code above 0; a signal
    never counts) before their first sign of life; `ended` says when they reach `limit`."""

    def __init__(self, limit: int = START_FAILURES) -> None:
        self.limit = limit
        self.in_row = 0

    def alive(self) -> None:
        """A fresh process showed a sign of life (a reply, its entry function running)."""
        self.in_row = 0

    def ended(self, lived: bool, exitcode: int | None) -> bool:
        """A process ended, after a sign of life (`lived`) or not: whether it makes `limit`
        in a row that died by themselves before any."""
        if lived:
            self.alive()
            return False
        if exitcode is None or exitcode <= 0:
            return False
        self.in_row += 1
        return self.in_row >= self.limit


def context() -> ForkServerContext:
    """The `forkserver` context, with `PRELOAD` (which takes effect when the server starts:
    the first process a parent starts through it)."""
    ctx = mp.get_context("forkserver")
    assert isinstance(ctx, ForkServerContext)
    with contextlib.suppress(ValueError, RuntimeError):
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


@contextlib.contextmanager
def _main_without_missing_file() -> Iterator[None]:
    """`__main__.__file__` hidden while it names no file (a script from stdin)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or os.path.exists(path):
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def start(process: BaseProcess) -> None:
    """`process.start()`, also from a script read from stdin (module docstring)."""
    with _main_without_missing_file():
        process.start()
