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
