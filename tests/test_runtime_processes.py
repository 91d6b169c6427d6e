"""Worker processes start from the fork server (runtime.processes), also from a script read
from stdin, whose main module names `<stdin>`, a file no child can import again; a script
that starts its run without the `__main__` guard stops with one line naming it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

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


UNGUARDED = textwrap.dedent("""
    import json, sys
    from slipstream.config import load_config
    from slipstream.run.launch import train_async
    train_async(load_config(None, json.loads(sys.argv[1])))  # no `if __name__ == "__main__":`
""")


@pytest.mark.slow  # ~15 s: the run is built again in each sampler that dies
def test_a_script_without_the_main_guard_stops_with_one_line_naming_it(tmp_path):
    """Each sampler re-imports the script, which starts the run again: multiprocessing
    refuses (a process started while bootstrapping), the sampler exits with code 1 before it
    starts. Before, it was restarted until `RuntimeError: sampler 0 (pid ...) exited with code
    1 and was already restarted 3 times (runtime.max_restarts)`, not naming the cause."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_orchestrator_local import REWARD, _cfg_overrides
    from tiny import write_assets

    assets = write_assets(tmp_path / "assets", REWARD)
    overrides = _cfg_overrides(assets, tmp_path / "run", 'schedule.name="pipeline"')
    (tmp_path / "unguarded.py").write_text(UNGUARDED)
    out = subprocess.run(
        [sys.executable, str(tmp_path / "unguarded.py"), json.dumps(overrides)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    said = "slipstream.runtime.processes.WorkersCannotStart: "
    (line,) = [x for x in out.stderr.splitlines() if x.startswith(said)] or [out.stderr[-3000:]]
    assert out.returncode == 1 and "sampler 0 exits before it starts (exit code 1, 3" in line
    assert 'under `if __name__ == "__main__":`' in line
