"""Bad input to `slipstream sim`, `plan` and `replay` is one line naming the flag and what it
expects, exit 2, before any work (the house standard of tests/test_cli_errors.py for train)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slipstream.cli import main

DATA = Path(__file__).parent / "data"


def _one_line(capsys, argv: list[str], *parts: str) -> None:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err.startswith(f"slipstream {argv[0]}: error: ") and "\n" not in err, err
    assert all(p in err for p in parts), err


@pytest.mark.parametrize(
    "argv, said",
    [
        # "no sampler/trainer split of 0 GPUs holds qwen2.5-7b", as if the model were the problem
        (["sim", "--gpus", "0"], "--gpus must be >= 1, got 0"),
        # "no trainer GPUs: 0 GPUs, None sampling"
        (["plan", "--gpus", "0", "--plot", ""], "--gpus must be >= 1, got 0"),
        # "steps (2) must exceed warmup_steps (2)": no such flag, and not the value given
        (["sim", "--steps", "2", "--gpus", "8"], "--steps must be >= 3, got 2"),
        (["plan", "--steps", "0", "--plot", ""], "--steps must be >= 1, got 0"),
        # numpy's "expected non-negative integer"
        (["sim", "--seed", "-1", "--gpus", "8"], "--seed must be >= 0, got -1"),
        # "no sampler engine: an engine needs 1 GPUs" / "no trainer GPUs: 8 GPUs, 8 sampling"
        (["sim", "--gpus", "8", "--samplers", "0"], "--samplers must be from 1 to 7"),
        (["sim", "--gpus", "8", "--samplers", "8"], "--samplers must be from 1 to 7"),
    ],
)
def test_sim_and_plan_counts(capsys, argv, said):
    _one_line(capsys, argv, said)


def test_plan_plot_in_a_missing_folder(capsys, tmp_path, monkeypatch):
    # the whole search ran, then "[Errno 2] No such file or directory: ..." without the flag
    def no_search(*a, **k):
        raise AssertionError("searched before checking --plot")

    monkeypatch.setattr("slipstream.sim.cli.plan", no_search)
    png = tmp_path / "no" / "plan.png"
    _one_line(capsys, ["plan", "--plot", str(png)], "--plot", "does not exist")
    _one_line(capsys, ["plan", "--plot", str(tmp_path / "plan.txt")], "--plot", "image file")


def test_replay_out_is_a_file(capsys, tmp_path, monkeypatch):
    # NotADirectoryError's traceback: the check looked only for a non-empty folder
    monkeypatch.setattr("slipstream.run.replay_run.read_meta", lambda run_dir: {})  # a record
    out = tmp_path / "out.json"
    out.write_text("{}")
    rc = main(["replay", str(DATA / "run_small"), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err, err
    assert f"--out {out} is a file" in err, err


def test_sim_model_a_folder_that_is_not_a_run(capsys, tmp_path):
    # "unknown model '/tmp/...'; valid: qwen2.5-0.5b, ...": as if a folder were a preset name
    _one_line(capsys, ["sim", "--gpus", "8", "--model", str(tmp_path)], "without model_info.json")
