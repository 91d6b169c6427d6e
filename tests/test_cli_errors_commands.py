"""Bad input to `slipstream sim`, `plan` and `replay` is one line naming the flag and what it
expects, exit 2, before any work (the house standard of tests/test_cli_errors.py for train)."""

from __future__ import annotations

import json
import shutil
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


@pytest.mark.parametrize(
    "argv, said",
    [
        # argparse's usage block, then the error: several lines before the one that matters
        (["train", "--bogus"], "unrecognized arguments: --bogus"),
        (["bench", "schedules", "--bogus"], "unrecognized arguments: --bogus"),
        (["bench", "schedules", "--eval-every", "x"], "--eval-every: invalid int value: 'x'"),
        (["bench", "schedules", "--seeds", "a,b"], "--seeds: expected comma-separated integers"),
        # (and it named RUN_DIR and the optional key=value items as both required)
        (["replay"], "the following arguments are required: RUN_DIR"),
        (["replay", str(DATA / "run_small"), "--out"], "argument --out: expected one argument"),
        # "eval.every: Input should be ...": a config key, not the flag given
        (["bench", "schedules", "--eval-every", "0"], "--eval-every must be >= 1, got 0"),
        # never reached, or reached at time 0 by every configuration: the bench trained anyway
        (["bench", "schedules", "--target", "nan"], "--target must be a finite held-out accuracy"),
        (["bench", "schedules", "--target-gain", "0"], "--target-gain must be a finite number > 0"),
        (["bench", "schedules", "--target-gain", "inf"], "--target-gain must be a finite number"),
    ],
)
def test_usage_errors_are_one_line_exit_2(capsys, tmp_path, monkeypatch, argv, said):
    def trained(*a, **k):
        raise AssertionError("a run trained before the bad argument was refused")

    monkeypatch.setattr("slipstream.run.bench.run_config", trained)
    monkeypatch.chdir(tmp_path)  # (the bench's default --out is runs/bench-<time> here)
    with pytest.raises(SystemExit) as e:  # argparse's exit, as `slipstream CMD` exits
        main([*argv, "--out", str(tmp_path / "b")] if argv[0] == "bench" else argv)
    err = capsys.readouterr().err.strip()
    prog = "slipstream bench schedules" if argv[0] == "bench" else f"slipstream {argv[0]}"
    assert e.value.code == 2 and err.startswith(f"{prog}: error: ") and "\n" not in err, err
    assert said in err, err
    assert not (tmp_path / "b").exists()


def _record(tmp_path, meta: object, files: dict[str, str]) -> str:
    """A copy of tests/data/run_small with a schedule record of `meta` and `files`."""
    run = tmp_path / "run"
    shutil.copytree(DATA / "run_small", run)
    (run / "schedule").mkdir()
    (run / "schedule" / "meta.json").write_text(json.dumps(meta))
    for name, text in files.items():
        (run / "schedule" / name).write_text(text)
    return str(run)


META = {"format": "slipstream-schedule", "version": 1, "complete": True}
COUNTS = {"samplers": 1, "trainer_threads": 1, "sampler_threads": 1}


@pytest.mark.parametrize(
    "meta, files, said",
    [
        # AttributeError: 'list' object has no attribute 'get'
        ([], {}, "meta.json: expected a JSON object, got list"),
        # KeyError: 'trainer_threads', after building the run
        (META, {}, "meta.json: samplers is None, expected a count >= 1"),
        # FileNotFoundError: [Errno 2] No such file or directory: '.../trainer.jsonl'
        ({**META, **COUNTS}, {}, "trainer.jsonl: missing from the schedule record"),
        # FileNotFoundError for the sampler's log, after the model was built
        ({**META, **COUNTS}, {"trainer.jsonl": '{"e": "draw"}\n'}, "sampler0.jsonl: missing"),
        # json.JSONDecodeError from a torn line, after the model was built
        (
            {**META, **COUNTS},
            {"trainer.jsonl": "{}\n", "sampler0.jsonl": '{"e": \n'},
            "sampler0.jsonl:1: not JSON",
        ),
    ],
)
def test_replay_of_a_damaged_record_is_one_line(capsys, tmp_path, monkeypatch, meta, files, said):
    def built(*a, **k):
        raise AssertionError("the replay was built before the record was checked")

    monkeypatch.setattr("slipstream.run.replay_run.TrainerReplay", built)
    rc = main(["replay", _record(tmp_path, meta, files)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and said in err, err


@pytest.mark.parametrize(
    "argv, prog",
    [
        # each of these began "slipstream: error: ", where a usage error of the same command
        # began "slipstream CMD: error: " (argparse's form)
        (["train", "run.steps=0"], "slipstream train"),
        (["replay", str(DATA / "run_small")], "slipstream replay"),
        (["bench"], "slipstream bench"),
        (["bench", "schedules", "trainer.lr=-1"], "slipstream bench schedules"),
        (["trian"], "slipstream"),  # no command known: the program's name alone
    ],
)
def test_every_error_of_a_command_starts_with_its_name(capsys, tmp_path, monkeypatch, argv, prog):
    def trained(*a, **k):
        raise AssertionError("a run trained before the bad input was refused")

    monkeypatch.setattr("slipstream.run.bench.run_config", trained)
    monkeypatch.chdir(tmp_path)  # (a run's or the bench's default folder is made here)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}: error: ") and "Traceback" not in err, err
    assert not list(tmp_path.iterdir())  # nothing started
