"""Test helper: the live processes of this machine, read from `/proc/PID/stat` alone.

Only `stat` is read (and `cwd`, a link, where a caller asks): `/proc/PID/environ` takes the
target's memory-map lock, and a read of it blocks for as long as another process holds that
lock (CI once hung for over an hour in a test that read it without a bound).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def stat_fields(pid: int | str) -> list[str] | None:
    """`/proc/PID/stat` after the command name: state, ppid, pgrp, session, ...; None when
    the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def live_processes() -> Iterator[tuple[int, list[str]]]:
    """(pid, stat fields) of every process that is not a zombie."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            fields = stat_fields(d.name)
            if fields is not None and fields[0] != "Z":
                yield int(d.name), fields


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie)."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def in_session(sid: int) -> list[int]:
    """Pids of live processes of session `sid` (an orphan keeps its session)."""
    return [pid for pid, f in live_processes() if int(f[3]) == sid]


def cwd_of(pid: int) -> str | None:
    """The working directory of `pid` (None: gone, or not readable)."""
    try:
        return str(Path(f"/proc/{pid}/cwd").readlink())
    except OSError:
        return None
