"""Worker processes start from the fork server (runtime.processes), also from a script read
from stdin, whose main module names `<stdin>`, a file no child can import again."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys, time
    from slipstream.runtime import processes
    ctx = processes.context()
    p = ctx.Process(target=time.sleep, args=(0,))
    (processes.start if sys.argv[1] == "start" else type(p).start)(p)
    p.join(60)
    print("exitcode", p.exitcode, "file", __file__)
""")


@pytest.mark.slow  # ~5 s: the fork server imports torch and the library once
@pytest.mark.parametrize("how", ["start", "plain"])
def test_a_worker_starts_from_a_script_read_from_stdin(how):
    out = subprocess.run(
        [sys.executable, "-", how], input=SCRIPT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    if how == "start":  # the child ran; the parent's __file__ is back
        assert "exitcode 0 file <stdin>" in out.stdout, out.stderr[-2000:]
    else:  # what `start` avoids: the child dies looking for the parent's `<stdin>`
        assert "exitcode 1" in out.stdout and "FileNotFoundError" in out.stderr
