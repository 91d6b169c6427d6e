"""`slipstream eval RUN_DIR`: a checkpoint evaluated again, in its run's own config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slipstream.cli import main
from slipstream.config import ConfigError
from slipstream.files import read_jsonl
from slipstream.run import eval_run
from slipstream.run.sync import train_sync
from tiny import tiny_cfg


def _last_eval(run_dir: Path) -> dict:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if "heldout_acc" in r][-1]


@pytest.mark.slow  # ~9 s of CPU: a 2-step run of the built-in task (and its warm start)
def test_eval_reproduces_the_runs_own_final_evaluation(tmp_path, capsys, monkeypatch) -> None:
    # the run evaluates itself at step 2 (eval.every=2) and checkpoints it (checkpoint.every=2):
    # the command's evaluation of that checkpoint, same settings, is the same to the bit
    summary = train_sync(
        tiny_cfg(tmp_path, "run", "eval.samples_per_prompt=2", "eval.temperature=0.8", steps=2)
    )
    run_dir = tmp_path / "run"
    last = _last_eval(run_dir)
    assert last["step"] == 2
    assert main(["eval", str(run_dir)]) == 0
    out = json.loads((run_dir / "evals" / "step_000002.json").read_text())
    assert out["step"] == 2 and out["heldout_acc"] == summary["heldout_acc_end"]
    assert out["metrics"] == {k: v for k, v in last.items() if k.startswith("heldout/")}
    rows = out["rewards"][""]
    assert len(rows) == 16 and all(len(r) == 2 for _, r in rows)  # eval.num_prompts x n
    assert sum(sum(r) for _, r in rows) / 32 == out["heldout_acc"]
    assert "mean@2" in capsys.readouterr().out
    # more samples: another file beside the first (nothing overwritten), n rewards a prompt;
    # from another folder, the evaluation works where the run was started (its relative paths)
    started = Path.cwd()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["eval", str(run_dir), "eval.samples_per_prompt=3"]) == 0
    assert Path.cwd() == started
    more = json.loads((run_dir / "evals" / "step_000002-2.json").read_text())
    assert more["eval"]["samples_per_prompt"] == 3 and len(more["rewards"][""][0][1]) == 3
    # the run's folder is not rewritten: its config still says 2 samples
    assert "samples_per_prompt = 2" in (run_dir / "config.toml").read_text()


def test_eval_refuses_what_would_not_be_the_run(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"no config\.toml"):
        eval_run.eval_config(run_dir, [], tmp_path / "scratch")
    run_dir.mkdir()
    (run_dir / "config.toml").write_text("")
    for bad in ("trainer.lr=1.0", "task.kind=builtin", "eval.samples_per_prompt"):
        with pytest.raises(ConfigError, match="changes only eval"):
            eval_run.eval_config(run_dir, [bad], tmp_path / "scratch")
    cfg = eval_run.eval_config(
        run_dir, ["eval.samples_per_prompt=8", "eval.temperature=1"], tmp_path / "scratch"
    )
    assert cfg.eval.samples_per_prompt == 8 and cfg.run.sinks == [] and cfg.run.quiet
    assert cfg.run.dir == str(tmp_path / "scratch")
    with pytest.raises(ConfigError, match="no checkpoint to evaluate"):
        eval_run.pick_checkpoint(run_dir, None)
    for step in (2, 10):
        (run_dir / "checkpoints" / f"step_{step:06d}").mkdir(parents=True)
        (run_dir / "checkpoints" / f"step_{step:06d}" / "state.json").write_text("{}")
    assert eval_run.pick_checkpoint(run_dir, None).name == "step_000010"
    assert eval_run.pick_checkpoint(run_dir, 2).name == "step_000002"
    with pytest.raises(ConfigError, match=r"no checkpoint of step 5 \(there are: 2, 10\)"):
        eval_run.pick_checkpoint(run_dir, 5)
    # from the command line: one line, exit 2
    assert main(["eval", str(run_dir), "trainer.lr=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slipstream eval: error: 'trainer.lr=1'") and err.count("\n") == 1


def test_out_path_numbers_a_second_evaluation(tmp_path) -> None:
    first = eval_run.out_path(tmp_path, 80)
    assert first == tmp_path / "evals" / "step_000080.json"
    first.parent.mkdir()
    first.write_text("{}")
    second = eval_run.out_path(tmp_path, 80)
    assert second.name == "step_000080-2.json"
    second.write_text("{}")
    assert eval_run.out_path(tmp_path, 80).name == "step_000080-3.json"


@pytest.mark.slow  # ~12 s of CPU: a 2-step run of the built-in agentic task
def test_eval_of_episodes_reproduces_the_runs_final_evaluation(tmp_path) -> None:
    tools = (
        "task.kind=builtin_tools", "warmstart.max_steps=5", "env.tool_latency_median_s=0.002",
        "env.tool_latency_p99_s=0.06", "env.max_turns=3", "eval.num_prompts=8",
        "eval.samples_per_prompt=2", "eval.temperature=0.8", "env.isolation=thread",
    )  # fmt: skip
    summary = train_sync(tiny_cfg(tmp_path, "tools", *tools, steps=2))
    out = eval_run.evaluate_checkpoint(tmp_path / "tools", [])
    assert out["heldout_acc"] == summary["heldout_acc_end"]
    last = _last_eval(tmp_path / "tools")
    assert out["metrics"] == {k: v for k, v in last.items() if k.startswith("heldout/")}
    assert set(out["metrics"]) == {"heldout/mean@2", "heldout/pass@1", "heldout/pass@2"}
    rewards = out["rewards"]
    assert isinstance(rewards, dict) and [len(r) for _, r in rewards[""]] == [2] * 8
