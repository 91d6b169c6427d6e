"""bench/keep_runs.py: the kept copy of a run folder reads back in bench/algorithms.py as the
original does (its curve and its `--reuse` match), without the keys and files it drops."""

from __future__ import annotations

import json
from pathlib import Path

from benchload import load_bench
from slipstream.config import load_config
from slipstream.config.load import dump_config


def _fake_run(folder: Path) -> None:
    folder.mkdir(parents=True)
    cfg = load_config(None, [f'run.dir="{folder}"', "run.steps=3"])
    (folder / "config.toml").write_text(dump_config(cfg))
    (folder / "summary.json").write_text(json.dumps({"steps": 3, "heldout_acc_start": 0.1}))
    records = [
        {"step": 1, "tokens/generated": 100, "loss": 0.5, "wall_s": 1.0},
        {"step": 2, "tokens/generated": 90, "loss": 0.4, "wall_s": 2.0, "heldout_acc": 0.2},
        {"step": 3, "tokens/generated": 80, "loss": 0.3, "wall_s": 3.0, "heldout_acc": 0.3},
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "big.bin").write_bytes(b"x" * 1000)


def test_the_kept_copy_reads_back_as_the_original(tmp_path, monkeypatch):
    keep, algorithms = load_bench("keep_runs"), load_bench("algorithms")
    src, dst = tmp_path / "runs", tmp_path / "kept"
    _fake_run(src / "seed0" / "no_filters")
    _fake_run(src / "seed0" / "zv+soft_band")
    (src / "seed0" / "unfinished").mkdir()  # no summary.json: not a finished run
    kept = keep.keep(src, dst)
    assert sorted(p.name for p in kept) == ["no_filters", "zv+soft_band"]
    original, copy = src / "seed0" / "no_filters", dst / "seed0" / "no_filters"
    assert (
        algorithms.curve(copy, 0.1)
        == algorithms.curve(original, 0.1)
        == [
            (0, 0.1),
            (190, 0.2),
            (270, 0.3),
        ]
    )
    assert not (copy / "checkpoints").exists()
    assert "loss" not in (copy / "metrics.jsonl").read_text()
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ['run.dir="kept/seed0/no_filters"', "run.steps=3"])
    assert algorithms.finished(cfg) == {"steps": 3, "heldout_acc_start": 0.1}


def test_trim_keeps_the_order_and_leaves_absent_keys_absent():
    keep = load_bench("keep_runs")
    text = '{"b": 2, "a": 1, "c": 3}\n\n{"c": 4}\n'
    assert keep.trim_metrics(text, ("a", "b")) == '{"a": 1, "b": 2}\n{}\n'


def test_a_kept_agentic_run_measures_as_the_original():
    """bench/agentic.py's `measures` on the kept records equals it on the full ones: deferred
    evaluation's clock (`time/eval_start_s`), engine busy, ESS and the lag histogram are kept
    (the first kept set dropped them, and stop 24's sweep read back 2.54x for 2.65x)."""
    keep, agentic = load_bench("keep_runs"), load_bench("agentic")
    records = [
        {"step": 1, "wall_s": 2.0, "time/eval_s": 0.0, "time/eval_start_s": 0.5, "loss": 1.0,
         "step_time_s": 1.5, "engine/busy_frac": 0.8, "staleness/ess_token": 0.99, "staleness/lag_mean": 1.5,
         "staleness/lag_hist": [10, 30], "env/turns_mean": 2.0},
        {"step": 2, "wall_s": 4.0, "time/eval_s": 0.25, "time/eval_start_s": 0.0,
         "heldout_acc": 0.3, "step_time_s": 0.5, "engine/busy_frac": 0.7, "staleness/ess_token": 0.95,
         "staleness/lag_mean": 2.0, "staleness/lag_hist": [5, 35], "env/turns_mean": 3.0},
    ]  # fmt: skip
    text = "".join(json.dumps(r) + "\n" for r in records)
    kept = [json.loads(x) for x in keep.trim_metrics(text, keep.KEYS).splitlines()]
    summary = {"heldout_acc_start": 0.2, "heldout_acc_end": 0.3, "wall_s": 5.0,
               "ledger": {"balanced": True}}  # fmt: skip
    full = {"summary": summary, "records": records, "eval_in_wall": False}
    assert agentic.measures({**full, "records": kept}, 0.0, gain=0.05) == agentic.measures(
        full, 0.0, gain=0.05
    )
    assert all("loss" not in r for r in kept)
