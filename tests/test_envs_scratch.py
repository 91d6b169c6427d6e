"""A pool of environment workers keeps its temporary folders in one folder, removed when its
owner goes: at `close()`, or by the janitor when the owner dies, SIGKILLed included."""

from __future__ import annotations

import glob
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slipstream.envs.scratch import ScratchRoot

OWNER = """
import time
from slipstream.envs.scratch import ScratchRoot
root = ScratchRoot()
open(root.folder() + "/left.txt", "w").write("x")  # a worker's file, its folder not removed
print(root.path, flush=True)
time.sleep(60)
"""

# a sampler's part: a pool of one worker whose step is inside a `python` call (60 s)
POOL_OWNER = """
from scripted_env import ByMode
from slipstream.envs.workers import ProcessWorkers
from slipstream.types import Prompt
workers = ProcessWorkers(ByMode, 1)
first = workers.first("s", Prompt("s", "", None, meta={"mode": "sandbox"}))
while not first.done():
    workers.pump(0.1)
workers.step("s", [5])
print(workers.workers[0].scratch, flush=True)  # its worker's folder
while True:
    workers.pump(0.1)
"""


def _start(code: str, tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    """`code` in a fresh interpreter whose temporary folder is `tmp_path`; the line it prints."""
    tests = str(Path(__file__).parent)
    path = os.pathsep.join([tests, *os.environ.get("PYTHONPATH", "").split(os.pathsep)])
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": path}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    return proc, proc.stdout.readline().strip() if ready else ""


def _gone(pattern: str, seconds: float) -> bool:
    """Whether nothing matches `pattern` (a path, or a glob) within `seconds`."""
    deadline = time.monotonic() + seconds
    while glob.glob(pattern) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not glob.glob(pattern)


def test_the_folder_of_an_owner_killed_by_sigkill_is_removed(tmp_path: Path) -> None:
    """Before, each worker's folder was removed by its pool (at a worker's replacement, at
    `close()`): a sampler SIGKILLed left every one of them in the temporary folder."""
    owner, root = _start(OWNER, tmp_path)
    try:
        assert root.startswith(str(tmp_path)) and glob.glob(f"{root}/worker-*/left.txt")
        owner.kill()
        owner.wait()
        assert _gone(root, 5.0), f"{root} was left behind"
    finally:
        owner.kill()


def test_close_removes_the_folder_at_once_and_lets_the_janitor_go() -> None:
    root = ScratchRoot()
    Path(root.folder(), "f.txt").write_text("x")
    assert root.janitor is not None and root.janitor.poll() is None
    root.close()
    assert not os.path.lexists(root.path) and root.janitor.poll() is not None
    root.close()  # a second time: nothing to do


@pytest.mark.slow  # ~10 s on the loaded 2-core machine: an interpreter, a forkserver, a worker
def test_a_sampler_killed_with_a_worker_in_a_sandbox_call_leaves_no_folder(
    tmp_path: Path,
) -> None:
    """The owner of a pool is SIGKILLed (as a sampler by the OOM killer) while its worker is
    inside a `python` call: the worker dies with the owner's fork server, the sandbox's
    supervisor with the worker, and no `slipstream-*` folder is left (before: the worker's
    folder, with the call's working directory in it)."""
    owner, folder = _start(POOL_OWNER, tmp_path)
    try:
        assert folder.startswith(str(tmp_path)), folder
        deadline = time.monotonic() + 30
        while not glob.glob(f"{folder}/slipstream-sandbox-*/main.py"):
            assert time.monotonic() < deadline, "the sandbox never started"
            time.sleep(0.05)
        owner.kill()
        owner.wait()
        assert _gone(folder, 10.0), f"left: {list(Path(folder).rglob('*'))}"
    finally:
        owner.kill()
    assert _gone(f"{tmp_path}/slipstream-*", 5.0)  # the pool's folder too
