"""`--resume` of bench/beyond.py and bench/staleness.py reads back only a finished run of the
same config (observe.runs.finished_summary), never one matched by its name and seed alone:
a run of other settings (steps, eval_every, overrides) in the folder is refused, an
unfinished one of the same settings trained again."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

from slipstream.config import Config, ConfigError
from slipstream.config.load import dump_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import beyond
import staleness

ROW = {
    "step": 1, "wall_s": 1.0, "heldout_acc": 0.3, "train/loss": 0.1, "staleness/ess_token": 1.0,
    "mismatch/kl": 0.0, "train/clip_frac": 0.0, "correction/masked_frac": 0.0,
    "time/train_s": 1.0, "staleness/lag_mean": 0.0,
}  # fmt: skip


def _fake_training(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`train_async` writing a finished run's folder (config.toml as the real one, one step
    record, summary.json with final accuracy 0.3) in no time; the folders it trained."""
    trained: list[str] = []

    def train_async(cfg: Config) -> dict[str, Any]:
        folder = Path(str(cfg.run.dir))
        assert not (folder / "metrics.jsonl").exists(), "trained into a folder holding a run"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.toml").write_text(dump_config(cfg))
        (folder / "metrics.jsonl").write_text(json.dumps(ROW) + "\n")
        summary = {"heldout_acc_start": 0.1, "heldout_acc_end": 0.3, "wall_s": 2.0,
                   "steps": 1, "ledger": {"stale": 0}}  # fmt: skip
        (folder / "summary.json").write_text(json.dumps(summary))
        trained.append(folder.name)
        return summary

    import slipstream.run.launch

    monkeypatch.setattr(slipstream.run.launch, "train_async", train_async)
    return trained


def _args(out: Path, **kw: Any) -> Namespace:
    base = {"out": str(out), "steps": 4, "eval_every": 2, "ckpt_every": 2, "resume": False,
            "target": 0.2, "target_gain": None, "seeds": [0], "lags": [1], "auto_starts": []}  # fmt: skip
    return Namespace(**{**base, **kw})


def test_beyond_resume_reads_back_only_a_finished_run_of_the_same_config(tmp_path, monkeypatch):
    trained = _fake_training(monkeypatch)
    ov = ["schedule.max_lag=1", "run.seed=0"]
    assert beyond.run_one("auto_K1_s0", ov, _args(tmp_path), [])["acc"] == 0.3
    assert trained == ["auto_K1_s0"]
    r = beyond.run_one("auto_K1_s0", ov, _args(tmp_path, resume=True), [])
    assert trained == ["auto_K1_s0"] and r["acc"] == 0.3 and r["reached"]  # read back
    # its one step: 2.0 s of training (no evaluation time recorded), the target (0.2) at step 1
    assert r["step_s"] == 2.0 and r["steps_to_target"] == 1
    # other settings under the same name and seed: refused, not read back as this run
    for other in ({"steps": 6}, {"eval_every": 4}):
        with pytest.raises(ConfigError, match=r"--resume: .* other settings"):
            beyond.run_one("auto_K1_s0", ov, _args(tmp_path, resume=True, **other), [])
    with pytest.raises(ConfigError, match="other settings"):
        beyond.run_one("auto_K1_s0", ov, _args(tmp_path, resume=True), ["trainer.lr=1e-5"])
    # an interrupted run of the same settings (no summary.json): trained again
    (tmp_path / "auto_K1_s0" / "summary.json").unlink()
    beyond.run_one("auto_K1_s0", ov, _args(tmp_path, resume=True), [])
    assert trained == ["auto_K1_s0", "auto_K1_s0"]


def test_beyond_resume_takes_nothing_from_an_earlier_results_json(tmp_path, monkeypatch):
    """The runs of a part are this call's, trained or read back from their folders: an entry
    of OUT/results.json under the same name and seed (another --steps, say) is not one."""
    trained = _fake_training(monkeypatch)
    done = {"K=1/s0": {"acc": 0.99, "time_to_target": 1.0, "reached": True, "seed": 0}}
    res = beyond.part_auto(_args(tmp_path, resume=True), [], done)
    assert trained == ["auto_K1_s0"] and res["K=1"][0]["acc"] == 0.3
    assert done["K=1/s0"]["acc"] == 0.3


def test_staleness_resume_reads_back_only_a_finished_run_of_the_same_config(tmp_path, monkeypatch):
    trained = _fake_training(monkeypatch)
    assert staleness.run_one(2, "none", 0, 4, tmp_path, [])["acc"] == 0.3
    r = staleness.run_one(2, "none", 0, 4, tmp_path, [], resume=True)
    assert trained == ["k2_none_s0"] and r["acc"] == 0.3  # read back
    with pytest.raises(ConfigError, match=r"--resume: .* other settings"):
        staleness.run_one(2, "none", 0, 6, tmp_path, [], resume=True)  # other steps
    with pytest.raises(ConfigError, match="other settings"):
        staleness.run_one(2, "none", 0, 4, tmp_path, ["trainer.lr=1e-5"], resume=True)
    (tmp_path / "k2_none_s0" / "summary.json").unlink()
    staleness.run_one(2, "none", 0, 4, tmp_path, [], resume=True)
    assert trained == ["k2_none_s0", "k2_none_s0"]


@pytest.mark.slow  # matplotlib's import (the plot)
def test_staleness_resume_takes_nothing_from_an_earlier_results_json(tmp_path, monkeypatch, capsys):
    trained = _fake_training(monkeypatch)
    stale = {"seed": 0, "acc": 0.99, "acc_start": 0.1, "wall_s": 1.0, "train_s": 1.0}
    (tmp_path / "results.json").write_text(json.dumps({"2/none": [stale]}))
    argv = ["--lags", "2", "--modes", "none", "--seeds", "0", "--steps", "4"]
    assert staleness.main([*argv, "--out", str(tmp_path), "--resume"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert trained == ["k2_none_s0"] and line["acc_by_lag"] == {"none": {"2": 0.3}}


def test_staleness_token_lag_after_k_is_over_the_tokens_trained(tmp_path, monkeypatch):
    """The table's "token lag mean after step K": steps K + 1 on, over their trained tokens
    (each step's lag_mean is over its lag_hist counts), not the plain mean of their means."""
    rows = [
        {**ROW, "step": 1, "staleness/lag_mean": 0.0, "staleness/lag_hist": [500, 0, 0]},
        {**ROW, "step": 2, "staleness/lag_mean": 2.0, "staleness/lag_hist": [0, 0, 1000]},
        {**ROW, "step": 3, "staleness/lag_mean": 1.0, "staleness/lag_hist": [0, 10, 0]},
    ]
    _fake_training(monkeypatch)
    import slipstream.run.launch

    fake = slipstream.run.launch.train_async

    def train_async(cfg: Config) -> dict[str, Any]:
        summary = fake(cfg)
        text = "".join(json.dumps(r) + "\n" for r in rows)
        (Path(str(cfg.run.dir)) / "metrics.jsonl").write_text(text)
        return summary

    monkeypatch.setattr(slipstream.run.launch, "train_async", train_async)
    r = staleness.run_one(1, "none", 0, 3, tmp_path, [])
    assert r["lag_mean_after_k"] == pytest.approx((2 * 1000 + 1 * 10) / 1010)  # not 1.5
