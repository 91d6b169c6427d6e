"""Worker processes that end with their parent: environment workers (envs.workers) and reward
workers (tasks.guard). Imports nothing heavy: a reward worker starts with it."""

from __future__ import annotations

import ctypes
import os
import signal
import sys


def die_with_parent(parent_pid: int | None = None) -> None:
    """Have the kernel SIGKILL this worker process when its parent dies (Linux
    `PR_SET_PDEATHSIG`): a worker inside a call, which would see its pipe close only at its next
    read, goes too. Where the parent died before that took effect (this process's parent is no
    longer `parent_pid`; None: it was reparented to init), exit at once. Elsewhere: nothing
    (the worker exits when its pipe closes)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1 if parent_pid is None else os.getppid() != parent_pid:
        os._exit(0)
