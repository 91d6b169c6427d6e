"""bench/gpu_session.sh's `readme` part on the CPU (`DEVICE=cpu`): the README's "Train on a GPU"
command, with its settings (the script reads them from the README), trains a chat model folder
built here to the end (the GPU run of the same part is in bench/results/gpu_s29/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_readme_gpu_command_runs_on_the_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PARTS": "readme", "DEVICE": "cpu"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # python3 = this one
    proc = subprocess.run(
        ["bash", "bench/gpu_session.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "=== readme: exit 0" in proc.stdout, proc.stdout
    log = (tmp_path / "readme.log").read_text()
    assert "the README's settings: model.dtype=bfloat16" in log and "schedule.name=pipeline" in log
    summary = json.loads((tmp_path / "readme_summary.json").read_text())
    assert summary["steps"] == 6 and summary["ledger"]["balanced"]
    assert summary["placement"] == {"trainer": "cpu", "samplers": ["cpu"]}
