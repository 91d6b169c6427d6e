"""A run folder holds one run: a fresh run does not train into another's folder, a resume
says what it changed and leaves no stale summary or schedule record, a bench reads back only
runs of its own settings; and the one-line errors (exit 2) of a bad run.dir or --seeds.

The training itself is replaced by a stub wherever the test is about what happens before it
(the checks run before any work), so these tests train nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from slipstream.cli import main
from slipstream.config import ConfigError, load_config
from slipstream.config.load import dump_config

TINY = ["run.quiet=true", "trainer.batch_prompts=4", "sampling.group_size=4"]


@pytest.fixture
def trained(monkeypatch) -> list[Any]:
    """`train_sync` stubbed: the configs it was called with (what `slipstream train` runs)."""
    import slipstream.run.sync

    calls: list[Any] = []
    monkeypatch.setattr(
        slipstream.run.sync,
        "train_sync",
        lambda cfg, resume=False, checked=False: calls.append(cfg),
    )
    return calls


def _one_line(err: str, *parts: str, prog: str = "slipstream train") -> None:
    err = err.strip()
    assert err.startswith(f"{prog}: error: ") and "\n" not in err, err
    assert "Traceback" not in err and all(p in err for p in parts), err


def _run_folder(path: Path, *overrides: str, ckpt: int | None = 2) -> Path:
    """A run folder as a run killed after its step-`ckpt` checkpoint leaves it (no weights:
    nothing here loads them)."""
    cfg = load_config(None, [f"run.dir={json.dumps(str(path))}", *TINY, *overrides])
    path.mkdir(parents=True)
    (path / "config.toml").write_text(dump_config(cfg))
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    if ckpt is not None:
        folder = path / "checkpoints" / f"step_{ckpt:06d}"
        folder.mkdir(parents=True)
        (folder / "state.json").write_text(json.dumps({"wall_s": 5.0}))
    return path


# ---- 1: a fresh run into a folder that holds a run ----


@pytest.mark.parametrize("held", ["metrics.jsonl", "checkpoints"])
def test_a_fresh_run_into_a_folder_holding_a_run_is_refused(tmp_path, capsys, trained, held):
    run = tmp_path / "run"
    run.mkdir()
    (run / held).mkdir() if held == "checkpoints" else (run / held).write_text('{"step": 1}\n')
    rc = main(["train", f"run.dir={json.dumps(str(run))}", "run.steps=1", *TINY])
    assert rc == 2 and trained == []
    _one_line(capsys.readouterr().err, "run.dir", str(run), "--resume", "another run.dir")
    assert sorted(p.name for p in run.iterdir()) == [held]  # nothing written


def test_a_folder_without_a_run_is_trained_into(tmp_path, trained):
    """A folder a run failed to start in (config.toml only) is not a run."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("")
    assert main(["train", f"run.dir={json.dumps(str(run))}", "run.steps=1", *TINY]) == 0
    assert len(trained) == 1


# ---- 2 and 5: a resume rewinds the summary and the schedule record ----


def test_a_resume_drops_the_old_summary(tmp_path):
    """A resumed run that stops early writes no summary.json: the killed or finished run's
    (its steps, its wall time) must not stay to be read as the resumed run's."""
    from slipstream.run.resume import latest_checkpoint, rewind

    run = _run_folder(tmp_path / "run")
    (run / "summary.json").write_text(json.dumps({"steps": 3, "wall_s": 9.0}))
    rewind(latest_checkpoint(run))
    assert not (run / "summary.json").exists()
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
    ]


def test_a_resume_marks_a_complete_schedule_record_incomplete(tmp_path, capsys):
    """A recorded run resumed (with run.record_schedule=false: a resumed run is never
    recorded) is no longer what its record describes: replay refuses it, saying why."""
    from slipstream.run.replay_run import read_meta
    from slipstream.run.resume import latest_checkpoint, rewind

    run = _run_folder(tmp_path / "run", 'runtime.kind="local"', 'schedule.name="pipeline"')
    (run / "schedule").mkdir()
    meta = {"format": "slipstream-schedule", "version": 1, "complete": True, "samplers": 1}
    (run / "schedule" / "meta.json").write_text(json.dumps(meta))
    read_meta(run)  # complete before
    rewind(latest_checkpoint(run))
    with pytest.raises(ConfigError, match=r"incomplete \(the run was resumed from step 2"):
        read_meta(run)
    assert main(["replay", str(run)]) == 2
    _one_line(capsys.readouterr().err, "resumed from step 2", prog="slipstream replay")


def test_replay_says_why_the_weights_were_not_compared(tmp_path, monkeypatch, capsys):
    """No checkpoint of the replay's last step kept in the original: not compared, not
    "differ"; the comparison names the missing checkpoint."""
    import slipstream.run.replay_run as rr

    weights = {"w": torch.zeros(2)}
    model = tmp_path / "replay" / "checkpoints" / "step_000004" / "model"
    model.mkdir(parents=True)
    save_file(weights, str(model / "model.safetensors"))
    (model.parent / "state.json").write_text("{}")
    (tmp_path / "orig").mkdir()
    got = rr.compare(tmp_path / "orig", tmp_path / "replay")
    assert got["weights_equal"] is None
    assert "original run kept no checkpoint step_000004" in got["weights_not_compared"]

    result = {
        "out": str(tmp_path / "replay"),
        "changed": [],
        "replay_wall_s": 1.0,
        "steps_compared": 4,
        "metric_differences": 0,
        "first_differences": [],
        "weights_equal": None,
        "weights_not_compared": got["weights_not_compared"],
    }
    monkeypatch.setattr(rr, "replay", lambda *a: result)
    # exit 0: nothing differs (the README's contract: 1 when a replay differs); was 1
    assert rr.replay_main([str(tmp_path / "orig")]) == 0
    out = capsys.readouterr().out
    assert "final weights not compared (the original run kept no checkpoint step_000004" in out
    assert "differ" not in out.replace("values differ", "")
    for key, value in (("weights_equal", False), ("metric_differences", 1)):
        monkeypatch.setattr(rr, "replay", lambda *a, k=key, v=value: {**result, k: v})
        assert rr.replay_main([str(tmp_path / "orig")]) == 1


# ---- 6: a resume with changed settings ----


def test_a_resume_with_changed_settings_warns_naming_them(tmp_path, capsys, trained):
    run = _run_folder(tmp_path / "run", "run.steps=4", 'trainer.lr_schedule="constant"')
    args = ["train", "--resume", str(run), "run.seed=5", "trainer.batch_prompts=2"]
    assert main([*args, "run.steps=6", "run.quiet=false"]) == 0 and len(trained) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("slipstream: warning: "), err
    assert "run.seed, trainer.batch_prompts" in err and "not bit-identical" in err
    assert "run.steps" not in err and "run.quiet" not in err


@pytest.mark.parametrize("entry", ["train_sync", "train_async"])
def test_a_library_resume_checks_what_the_cli_checks(tmp_path, entry):
    """`train_sync(cfg, resume=True)` and `train_async` made none of the CLI's checks: a
    `run.steps` below the checkpoint's step went on (and trained nothing), and settings changed
    since the run were taken silently. Now the run stops at once (ConfigError, nothing
    rewound), and a change is a `ResumeWarning` naming it."""
    from slipstream.run.launch import train_async
    from slipstream.run.resume import ResumeWarning, check_resume
    from slipstream.run.sync import train_sync

    run = _run_folder(tmp_path / "run", "run.steps=4", 'trainer.lr_schedule="constant"')
    train = {"train_sync": train_sync, "train_async": train_async}[entry]
    short = load_config(run / "config.toml", ["run.steps=1"])
    with pytest.raises(ConfigError, match=r"run.steps = 1 is below the step of the newest"):
        train(short, resume=True)
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3  # not rewound
    other = load_config(run / "config.toml", ["run.seed=5"])
    with pytest.warns(ResumeWarning, match=r"other settings than it ran with \(run.seed\)"):
        check_resume(other)


def test_a_resume_changing_only_length_display_and_sinks_says_nothing(tmp_path, capsys, trained):
    """Under a constant learning rate (after warm-up) the run's length changes nothing it
    computes; under cosine it does (next test)."""
    run = _run_folder(
        tmp_path / "run",
        "run.steps=4",
        "run.record_schedule=false",
        'trainer.lr_schedule="constant"',
    )
    more = ["run.steps=8", "run.quiet=false", "wandb.mode=disabled", "run.rollouts_per_step=0"]
    assert main(["train", "--resume", str(run), *more]) == 0 and len(trained) == 1
    assert capsys.readouterr().err == ""


def test_a_longer_resume_under_a_decaying_learning_rate_warns_that_it_changes(
    tmp_path, capsys, trained
):
    """`--resume runs/x run.steps=400` (README) recomputes the cosine schedule over 400 steps:
    the learning rate from the resumed step on is not the one the run had. It said nothing
    (run.steps counted as changing nothing the run computes)."""
    run = _run_folder(tmp_path / "run", "run.steps=4")  # trainer.lr_schedule: cosine
    assert main(["train", "--resume", str(run), "run.steps=8"]) == 0 and len(trained) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("slipstream: warning: "), err
    assert "(run.steps)" in err and "cosine learning-rate schedule is recomputed" in err
    assert "from the resumed step on the learning rate follows the new schedule" in err


def test_a_resume_below_its_checkpoint_is_refused(tmp_path, capsys, trained):
    run = _run_folder(tmp_path / "run", "run.steps=4")
    assert main(["train", "--resume", str(run), "run.steps=1"]) == 2 and trained == []
    _one_line(capsys.readouterr().err, "run.steps = 1", "step_000002", "run.steps >= 2")


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "ran, change, says",
    [  # the checkpoint's queue is continuous; the in-process loop keeps none
        ('schedule.name="pipeline"', 'schedule.name="double_buffer"', "'pipeline'"),
        ('schedule.name="sync"', 'runtime.kind="inprocess"', "'local'"),
    ],
)
def test_a_resume_under_another_queue_is_refused_before_anything_is_written(
    tmp_path, capsys, monkeypatch, ran, change, says
):
    """A pipeline run resumed with schedule.name="double_buffer" restored its continuous
    requests (batch -1) into fixed batching and died in its first message (KeyError: -1),
    after config.toml was rewritten with the new schedule: a plain retry failed the same way."""
    import slipstream.run.launch
    import slipstream.run.sync

    loops = (slipstream.run.launch, "train_async"), (slipstream.run.sync, "train_sync")
    real = {name: getattr(module, name) for module, name in loops}
    calls: list[Any] = []
    for module, name in loops:  # stubbed for `main`
        monkeypatch.setattr(
            module, name, lambda cfg, resume=False, checked=False: calls.append(cfg)
        )
    run = _run_folder(tmp_path / "run", 'runtime.kind="local"', ran)
    before = _files(run)
    assert main(["train", "--resume", str(run), change]) == 2 and calls == []
    setting = change.split("=")[0]
    _one_line(capsys.readouterr().err, setting, says, f"resume it with {setting} = {says}")
    assert _files(run) == before
    train = real["train_sync" if "inprocess" in change else "train_async"]
    with pytest.raises(ConfigError, match=setting):  # called as a function, the same refusal
        train(load_config(run / "config.toml", [change]), resume=True)
    assert _files(run) == before


# ---- 4: one-line errors ----


def test_a_run_dir_that_cannot_be_made_is_one_line(tmp_path, capsys, trained):
    afile = tmp_path / "afile"
    afile.write_text("")
    for where, says in (("/dev/null/x", "/dev/null is not a folder"), (afile, "is a file")):
        assert main(["train", f"run.dir={json.dumps(str(where))}", "run.steps=1", *TINY]) == 2
        _one_line(capsys.readouterr().err, "run.dir", str(where), says)
    assert trained == []


# ---- 3: bench schedules --reuse ----

NAME = "sync_inprocess"


# what the bench sets for `NAME` with seed 0 (run.bench.bench_config), beside `TINY`
BENCH = ["eval.every=5", "run.seed=0", 'schedule.name="sync"', 'runtime.kind="inprocess"']


def _write_run(folder: Path, *overrides: str, finished: bool = True) -> dict[str, Any]:
    """A run of `NAME` with seed 0 in `folder`, made with `overrides` on the bench's settings,
    as a run leaves it; its summary."""
    cfg = load_config(None, [*BENCH, *TINY, *overrides, f"run.dir={json.dumps(str(folder))}"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.toml").write_text(dump_config(cfg))
    rec = {"step": 1, "wall_s": 2.0, "time/eval_s": 0.5, "step_time_s": 2.0}
    rec |= {"time/generate_s": 1.0, "heldout_acc": 0.5}
    (folder / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
    summary = {"heldout_acc_start": 0.25, "heldout_acc_end": 0.5, "wall_s": 2.0}
    if finished:
        (folder / "summary.json").write_text(json.dumps(summary))
    return summary


BENCH_PROG = "slipstream bench schedules"


def _bench(out: Path, *more: str) -> list[str]:
    return ["bench", "schedules", *TINY, "--presets", NAME, "--seeds", "0", "--out", str(out), *more]  # fmt: skip


@pytest.fixture
def bench_trained(monkeypatch) -> list[Any]:
    """The bench's training stubbed (`train_sync`, which `NAME` runs): the configs it trained,
    each leaving a finished run of them, never into a folder holding another run."""
    import slipstream.run.sync

    calls: list[Any] = []

    def train_sync(cfg: Any, resume: bool = False) -> dict[str, Any]:
        folder = Path(cfg.run.dir)
        assert not (folder / "metrics.jsonl").exists(), "trained into another run's folder"
        calls.append(cfg)
        return _write_run(folder)

    monkeypatch.setattr(slipstream.run.sync, "train_sync", train_sync)
    return calls


def test_bench_reuse_reads_back_a_run_of_the_same_settings(tmp_path, bench_trained):
    _write_run(tmp_path / "b" / NAME)
    assert main(_bench(tmp_path / "b", "--reuse")) == 0 and bench_trained == []


def test_bench_reuse_refuses_a_finished_run_of_other_settings(tmp_path, capsys, bench_trained):
    _write_run(tmp_path / "b" / NAME, "trainer.lr=0.5")
    assert main(_bench(tmp_path / "b", "--reuse")) == 2 and bench_trained == []
    _one_line(
        capsys.readouterr().err,
        "--reuse",
        "other settings (trainer.lr)",
        "another --out",
        prog=BENCH_PROG,
    )


def test_bench_reuse_trains_an_unfinished_run_again(tmp_path, bench_trained):
    _write_run(tmp_path / "b" / NAME, finished=False)
    assert main(_bench(tmp_path / "b", "--reuse")) == 0 and len(bench_trained) == 1


def test_bench_reuse_trains_a_run_with_a_torn_summary_again(tmp_path, bench_trained):
    """A summary.json torn by a crash (written in place, before `slipstream.files.write_atomic`) is
    not a finished run's: finished_summary raised JSONDecodeError on it, stopping the bench."""
    from slipstream.observe.runs import finished_summary

    folder = tmp_path / "b" / NAME
    _write_run(folder)
    (folder / "summary.json").write_text('{"heldout_acc_start": 0.25, "wall')
    cfg = load_config(None, [*BENCH, *TINY, f"run.dir={json.dumps(str(folder))}"])
    assert finished_summary(cfg) is None
    assert main(_bench(tmp_path / "b", "--reuse")) == 0 and len(bench_trained) == 1
    assert json.loads((folder / "summary.json").read_text())["heldout_acc_end"] == 0.5


@pytest.mark.parametrize("config", ["other", "missing"])
def test_bench_reuse_keeps_an_unfinished_run_of_other_settings(
    tmp_path, capsys, bench_trained, config
):
    """--reuse trains an unfinished run of the same settings again (removing its folder); one
    of other settings, or without a config.toml, is not this bench's run to remove."""
    folder = tmp_path / "b" / NAME
    _write_run(folder, "trainer.lr=0.5", finished=False)
    if config == "missing":
        (folder / "config.toml").unlink()
    assert main(_bench(tmp_path / "b", "--reuse")) == 2 and bench_trained == []
    why = "trainer.lr" if config == "other" else "no config.toml"
    _one_line(capsys.readouterr().err, "an unfinished run of other settings", why, prog=BENCH_PROG)
    assert (folder / "metrics.jsonl").is_file()


def test_bench_without_reuse_refuses_a_folder_holding_a_run(tmp_path, capsys, bench_trained):
    _write_run(tmp_path / "b" / NAME)
    assert main(_bench(tmp_path / "b")) == 2 and bench_trained == []
    _one_line(capsys.readouterr().err, "already holds a run", "--reuse", prog=BENCH_PROG)


@pytest.mark.parametrize("seeds", ["--seeds=a,b", "--seeds=", "--seeds=1,1"])
def test_bad_bench_seeds_are_a_usage_error(tmp_path, capsys, bench_trained, seeds):
    from slipstream.run.bench import bench_schedules_main

    with pytest.raises(SystemExit) as e:
        bench_schedules_main([seeds, "--presets", NAME, "--out", str(tmp_path / "b")])
    assert e.value.code == 2 and bench_trained == []
    err = capsys.readouterr().err
    assert "--seeds" in err and "Traceback" not in err
    assert not (tmp_path / "b").exists()


def test_runs_started_in_one_second_get_folders_of_their_own(tmp_path, monkeypatch) -> None:
    """Without run.dir a run's folder is runs/<UTC time to the second>; two runs started in one
    second shared it (and, with the check above, the second would now be refused)."""
    import datetime as dt
    from types import SimpleNamespace

    from slipstream.config import load_config
    from slipstream.run import folder

    noon = dt.datetime(2026, 12, 5, 12, 0, 0, tzinfo=dt.UTC)
    clock = SimpleNamespace(datetime=SimpleNamespace(now=lambda tz: noon), UTC=dt.UTC)
    monkeypatch.setattr(folder, "dt", clock)
    monkeypatch.chdir(tmp_path)
    made = [folder.make_run_dir(load_config(None, [])) for _ in range(3)]
    assert [str(p) for p in made] == [
        "runs/20261205-120000",
        "runs/20261205-120000-2",
        "runs/20261205-120000-3",
    ]
    assert all((p / "config.toml").exists() for p in made)


def test_launch_json_is_written_through_write_atomic(tmp_path, monkeypatch) -> None:
    """A consistency check, not a proof of atomicity: launch.json goes through
    `slipstream.files.write_atomic`, as config.toml does (a plain write_text, torn by a kill,
    left a file `started_in` silently ignored). It shows only that the atomic writer is used."""
    from slipstream.config import load_config
    from slipstream.run import folder

    written: list[str] = []
    real = folder.write_atomic

    def spy(path: Path, text: str) -> None:
        written.append(path.name)
        real(path, text)

    monkeypatch.setattr(folder, "write_atomic", spy)
    monkeypatch.chdir(tmp_path)
    made = folder.make_run_dir(load_config(None, []))
    assert written == ["config.toml", "launch.json"]
    assert folder.started_in(made) == tmp_path
