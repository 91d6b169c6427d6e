"""A run with no held-out rows (`task.heldout_fraction=0`, no held-out path or split) logs no
held-out metric: no `heldout_acc` of 0.0 over an empty set, in either loop, and its last line
says "no held-out rows", not an accuracy of 0.000 -> 0.000."""

from __future__ import annotations

import json

import pytest

from slipstream.config import load_config
from slipstream.files import read_jsonl
from slipstream.run.launch import train_async
from slipstream.run.sync import train_sync
from tiny import write_assets


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["sync", "async"])
def test_no_heldout_rows_means_no_heldout_metric(tmp_path, capsys, loop):
    folder = write_assets(tmp_path, "def reward(p, c):\n    return float(len(c) % 2)\n")
    cfg = load_config(None, [
        f'run.dir="{tmp_path / "run"}"', "run.steps=2", "run.quiet=true", "run.threads=1",
        "trainer.batch_prompts=2", "sampling.group_size=2", "sampling.max_new_tokens=4",
        "filters.zero_variance=false", "eval.every=1", f'model.path="{folder / "model"}"',
        f'task.path="{folder / "rows.jsonl"}"', f'task.reward="{folder / "reward.py"}:reward"',
        "task.heldout_fraction=0", "task.max_train_prompts=8",
        *(["schedule.name=async"] if loop == "async" else []),
    ])  # fmt: skip
    summary = (train_sync if loop == "sync" else train_async)(cfg)
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert len(records) == 2 and not any("heldout_acc" in r for r in records)
    assert summary["heldout_acc_start"] is None and summary["heldout_acc_end"] is None
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["heldout_acc_start"] is None
    done = [x for x in capsys.readouterr().err.splitlines() if x.startswith("done: ")]
    assert len(done) == 1 and "; no held-out rows; " in done[0], done  # not 0.000 -> 0.000
    assert "held-out accuracy" not in done[0]
    # two tiny steps take well under 10 s: their time has a decimal (it read "in 0s")
    assert f"2 steps in {saved['wall_s']:.1f}s;" in done[0], (done, saved["wall_s"])


def test_a_config_refused_at_setup_leaves_no_run_folder(tmp_path):
    """Setup's own refusals (here: no training prompt fits `engine.max_len`) come before the
    run folder is made: a config that cannot run leaves no folder with its config.toml."""
    from slipstream.config import ConfigError
    from slipstream.run.setup import setup

    folder = write_assets(tmp_path, "def reward(p, c):\n    return 1.0\n")
    cfg = load_config(None, [
        f'run.dir="{tmp_path / "run"}"', "run.quiet=true", "run.threads=1",
        "sampling.max_new_tokens=8", "engine.max_len=9", f'model.path="{folder / "model"}"',
        f'task.path="{folder / "rows.jsonl"}"', f'task.reward="{folder / "reward.py"}:reward"',
    ])  # fmt: skip
    with pytest.raises(ConfigError, match=r"engine\.max_len"):
        setup(cfg)
    assert not (tmp_path / "run").exists()
