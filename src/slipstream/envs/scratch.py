"""One temporary folder for a pool of environment workers, removed even if its owner is killed.

`ScratchRoot()` makes a folder (`slipstream-env-workers-*` in the temporary folder) for the
folders of the pool's workers (`folder()`), and starts a janitor: a small interpreter (`python
-I -S`, in a session of its own, so a Ctrl-C in the terminal does not reach it) that reads its
stdin until the end, which comes when the owner calls `close()` or dies, SIGKILLed included
(the kernel closes the owner's end of the pipe), and then removes the folder. A worker dying
with its owner may still write for a moment (its sandboxes' supervisors clean up as they go),
so the janitor removes the folder again until it is gone, for up to `JANITOR_S`.
`close()` removes the folder itself (at once) and lets the janitor go.

What a SIGKILL of the janitor itself, with its owner, leaves is the folder: one place to look
for (`slipstream-env-workers-*`), not one folder per worker.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile

JANITOR_S = 30.0  # how long the janitor tries to remove a folder that is written again

_JANITOR = r"""
import os, shutil, sys, time
root = sys.argv[1]
sys.stdin.buffer.read()  # returns at the end: the owner closed it or died
end = time.monotonic() + float(sys.argv[2])
while os.path.lexists(root) and time.monotonic() < end:
    shutil.rmtree(root, ignore_errors=True)
    time.sleep(0.05)
"""


def start_janitor(root: str) -> subprocess.Popen[bytes] | None:
    """A janitor that removes `root` once its stdin closes (module docstring); None if no
    interpreter can be started (`sys.executable` empty: an embedded Python)."""
    if not sys.executable:
        return None
    cmd = [sys.executable, "-I", "-S", "-B", "-c", _JANITOR, root, str(JANITOR_S)]
    try:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return None


class ScratchRoot:
    """The temporary folder of a pool of workers (module docstring)."""

    def __init__(self, prefix: str = "slipstream-env-workers-") -> None:
        self.path = tempfile.mkdtemp(prefix=prefix)
        os.chmod(self.path, 0o711)  # a sandbox run as another user (SandboxLimits.uid) gets in
        self.janitor = start_janitor(self.path)

    def folder(self) -> str:
        """A fresh folder for one worker, inside the root."""
        path = tempfile.mkdtemp(prefix="worker-", dir=self.path)
        os.chmod(path, 0o711)
        return path

    def close(self) -> None:
        """Remove the root and everything in it now; the janitor exits. Safe to call twice."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self.janitor is not None:
            with contextlib.suppress(OSError):
                if self.janitor.stdin is not None:
                    self.janitor.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.janitor.wait(timeout=5.0)
