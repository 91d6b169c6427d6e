"""bench/algorithms.py's `--reuse`: a finished run is found again whatever path names its folder."""

from __future__ import annotations

import json

from benchload import load_bench
from slipstream.config import load_config
from slipstream.config.load import dump_config


def test_a_finished_run_is_reused_under_a_relative_or_an_absolute_folder(tmp_path, monkeypatch):
    bench = load_bench("algorithms")
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "runs" / "seed6" / "no_filters"
    folder.mkdir(parents=True)
    absolute = load_config(None, [f'run.dir="{folder}"', "run.steps=7"])
    (folder / "config.toml").write_text(dump_config(absolute))
    (folder / "summary.json").write_text(json.dumps({"steps": 7}))
    relative = load_config(None, ['run.dir="runs/seed6/no_filters"', "run.steps=7"])
    assert bench.finished(absolute) == {"steps": 7}
    assert bench.finished(relative) == {"steps": 7}  # it retrained such a run (found None)
    other = load_config(None, ['run.dir="runs/seed6/no_filters"', "run.steps=8"])
    assert bench.finished(other) is None  # another setting is another run
