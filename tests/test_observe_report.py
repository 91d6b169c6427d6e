"""`slipstream report` on a small recorded run folder (tests/data/run_small, made by
tests/data/make_run_small.py): every figure is a real image, the page loads in a browser."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.image import imread

from slipstream.observe.figures import FIGURES, save
from slipstream.observe.report import report_main, summary_rows
from slipstream.observe.runs import (
    RunData,
    comparison_notice,
    differing_settings,
    load_run,
    load_runs,
)
from slipstream.schedule.ledger import Ledger

RUN_SMALL = Path(__file__).parent / "data" / "run_small"
CHROMIUM = Path("/usr/bin/chromium")


def assert_png(path: Path) -> None:
    """A decodable PNG with pixels that are not all one colour."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path.name}: not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 100 and height > 100 and data[-8:-4] == b"IEND", f"{path.name}: truncated"
    pixels = imread(path)
    assert pixels.shape[:2] == (height, width) and float(np.std(pixels)) > 0.01, (
        f"{path.name}: blank"
    )


def sync_copy(tmp_path: Path) -> Path:
    """The recorded run relabelled as a `sync` run, with no staleness keys (as sync writes)."""
    d = tmp_path / "run_sync"
    shutil.copytree(RUN_SMALL, d)
    cfg = (d / "config.toml").read_text().replace('name = "pipeline"', 'name = "sync"')
    (d / "config.toml").write_text(cfg)
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if not k.startswith("staleness/")} for r in rows]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


@pytest.mark.parametrize("name", list(FIGURES))
def test_each_figure_overlays_two_runs_as_a_png(name: str, tmp_path: Path) -> None:
    runs = load_runs([RUN_SMALL, sync_copy(tmp_path)])
    save(FIGURES[name][1](runs), tmp_path / name)
    assert_png(tmp_path / name)


def test_figures_of_a_run_with_only_metrics_say_what_is_missing(tmp_path: Path) -> None:
    d = tmp_path / "bare"
    d.mkdir()
    shutil.copy(RUN_SMALL / "metrics.jsonl", d)
    run = load_run(d)
    assert run.timeline == [] and run.summary is None and run.ledger is None
    assert run.final_ledger() == {
        "generated": 80,
        "trained": 77,
        "filtered": {"all reasons": 3},
        "stale": 0,
        "aborted": 0,
        "lost": 0,
    }
    for name in ("timeline.png", "ledger.png"):
        save(FIGURES[name][1]([run]), tmp_path / name)
        assert_png(tmp_path / name)


def test_summary_of_the_recorded_run() -> None:
    rows = summary_rows(load_run(RUN_SMALL), None)
    assert rows["schedule"] == "pipeline" and rows["steps"] == "10"
    assert rows["held-out accuracy"] == "0.047 → 0.354"
    # This recording has neither summary.json's lag_mean nor lag_hist per step, so the steps'
    # means are averaged unweighted; each is 1.5, so any weighting would give 1.50 as well.
    assert rows["lag mean / max"] == "1.50 / 2"
    assert rows["sampler busy (mean)"] == "95%"  # weighted by step_time_s
    assert rows["ledger: generated / trained"] == "80 / 77" and rows["ledger balanced"] == "yes"
    assert rows["ledger: filtered"] == "zero_variance 3"


def _two_unequal_steps(summary: dict[str, Any] | None) -> RunData:
    """Step 1: 1000 trained tokens at lag 0, a 9 s step, samplers 90% busy; step 2: 10 tokens
    at lag 1, a 1 s step, 10% busy."""
    rows: list[dict[str, Any]] = [
        {"step": 1, "wall_s": 9.0, "step_time_s": 9.0, "runtime/sampler_busy": 0.9},
        {"step": 2, "wall_s": 10.0, "step_time_s": 1.0, "runtime/sampler_busy": 0.1},
    ]
    for row, lag, hist in zip(rows, (0.0, 1.0), ([1000, 0], [0, 10]), strict=True):
        row |= {"staleness/lag_mean": lag, "staleness/lag_max": lag, "staleness/lag_hist": hist}
    return RunData(dir=Path("."), label="a", metrics=rows, summary=summary)


def test_lag_and_busy_weight_steps_by_tokens_and_time_as_summary_json_does() -> None:
    rows = summary_rows(_two_unequal_steps(None), None)
    # tokens: (1000 * 0 + 10 * 1) / 1010; time: (9 * 0.9 + 1 * 0.1) / 10
    assert rows["lag mean / max"] == "0.01 / 1" and rows["sampler busy (mean)"] == "82%"
    rows = summary_rows(_two_unequal_steps({"lag_mean": 0.25, "sampler_busy": 0.7}), None)
    assert rows["lag mean / max"] == "0.25 / 1" and rows["sampler busy (mean)"] == "70%"


def test_the_ledger_bar_and_rows_show_every_counter_the_ledger_settles() -> None:
    ledger = Ledger(generated=24, trained=10, stale=1, aborted=1, lost=1, poisoned=1)
    ledger.filtered["zero_variance"] = 2
    ledger.unfinished, ledger.discarded, ledger.in_flight = 4, 3, 1
    led = ledger.as_dict()
    assert led["balanced"]
    run = RunData(dir=Path("."), label="a", metrics=[{"step": 1, "wall_s": 1.0}], ledger=led)
    fig = FIGURES["ledger.png"][1]([run])
    assert sum(p.get_width() for p in fig.axes[0].patches) == led["generated"]
    rows = summary_rows(run, None)
    key = "ledger: stale / aborted / lost / poisoned / unfinished / discarded / in flight"
    assert rows[key] == "1 / 1 / 1 / 1 / 4 / 3 / 1"


def test_bad_input_is_one_line_on_stderr_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (
            [str(tmp_path / "nope"), "--out", str(tmp_path / "o")],
            "nope: not a run folder (no such directory)",
        ),
        ([str(tmp_path), "--out", str(tmp_path / "o")], "not a run folder (no metrics.jsonl)"),
        ([str(RUN_SMALL)], "the following arguments are required: --out"),
    ]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text('{"step": 1}\n{"step": \n{"step": 3}\n')
    cases.append(([str(bad), "--out", str(tmp_path / "o")], "metrics.jsonl:2: not valid JSON"))
    for argv, message in cases:
        assert report_main(argv) == 2
        err = capsys.readouterr().err
        assert (
            err.count("\n") == 1 and err.startswith("slipstream report: error: ") and message in err
        )


def test_a_partial_last_line_of_a_live_run_is_ignored(tmp_path: Path) -> None:
    d = tmp_path / "live"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"step": 1, "wall_s": 1.0}\n{"step": 2, "wa')
    assert [r["step"] for r in load_run(d).metrics] == [1]


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.srcs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.srcs.append(dict(attrs)["src"] or "")


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    out = tmp / "out"
    assert report_main([str(RUN_SMALL), str(sync_copy(tmp)), "--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_report_writes_index_and_every_figure(report_dir: Path) -> None:
    page = (report_dir / "index.html").read_text()
    images = _Images()
    images.feed(page)
    assert images.srcs == list(FIGURES)
    for name in FIGURES:
        assert_png(report_dir / name)
    assert "run_small" in page and "run_sync" in page and "Rollouts of the last step" in page


@pytest.mark.slow
def test_report_loads_in_headless_chromium_without_errors(report_dir: Path, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip("chromium not installed: apt-get install chromium")
    flags = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
    ]
    url = (report_dir / "index.html").as_uri()
    dom = subprocess.run(
        [*flags, f"--user-data-dir={tmp_path / 'a'}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    # Chromium logs every console message (errors, uncaught exceptions) as a CONSOLE line.
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
    # The page's own check marks images that failed to load (see report._CHECK_SCRIPT).
    assert f'data-figures-loaded="{len(FIGURES)}"' in dom.stdout
    assert 'class="broken"' not in dom.stdout
    shot = tmp_path / "page.png"
    subprocess.run(
        [
            *flags,
            f"--user-data-dir={tmp_path / 'b'}",
            "--window-size=1100,2000",
            f"--screenshot={shot}",
            url,
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert_png(shot)


def test_lag_figure_counts_tokens_from_the_step_histograms(tmp_path):
    """The lag figure sums each step record's `staleness/lag_hist` (the key the trainer
    writes): token shares per lag, not the fallback of per-step maxima."""
    from slipstream.observe.figures import _lag_distribution
    from slipstream.observe.runs import RunData

    rows = [{"step": 1, "staleness/lag_hist": [3, 1], "staleness/lag_max": 1},
            {"step": 2, "staleness/lag_hist": [0, 2, 2], "staleness/lag_max": 2}]  # fmt: skip
    dist = _lag_distribution(RunData(tmp_path, "r", rows))
    assert dist is not None
    share, what = dist
    assert what == "tokens" and share.tolist() == [0.375, 0.375, 0.25]  # 3/8, 3/8, 2/8


def _relabelled(tmp_path: Path, name: str, *edits: tuple[str, str]) -> Path:
    """A copy of the recorded run named `name`, its config.toml edited (old, new)."""
    d = tmp_path / name
    shutil.copytree(RUN_SMALL, d)
    text = (d / "config.toml").read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    (d / "config.toml").write_text(text)
    return d


def _report(monkeypatch, capsys, runs: list[Path], out: Path) -> tuple[str, str]:
    """`slipstream report` of `runs` without its figures (drawing them takes seconds; the
    notice and the table do not depend on them): its stderr and the page."""
    monkeypatch.setattr("slipstream.observe.report.FIGURES", {})
    assert report_main([*map(str, runs), "--out", str(out)]) == 0
    return capsys.readouterr().err, (out / "index.html").read_text()


def test_runs_of_different_settings_are_named_not_mixed_silently(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Runs of another schedule, seed, task or held-out set were overlaid and tabled as if
    comparable, the table showing six fixed settings: now one line on stderr and on the page
    names every setting they differ in (a warning where the curves are not on one scale), and
    the table has a row for each; runs of one configuration get no line."""
    a = _relabelled(tmp_path, "a", ('dir = "tests/data/run_small"', 'dir = "a"'))  # (no matter)
    b = _relabelled(tmp_path, "b", ('name = "pipeline"', 'name = "sync"'), ("seed = 0", "seed = 1"))
    err, page = _report(monkeypatch, capsys, [a, b], tmp_path / "o1")
    note = "note: the runs differ in run.seed, schedule.name (side by side in the summary table)"
    assert err == f"slipstream report: {note}\n"
    assert f'<p class="notice">{note}</p>' in page
    assert "<tr><th>run.seed</th><td>0</td><td>1</td></tr>" in page

    c = _relabelled(tmp_path, "c", ('kind = "builtin"', 'kind = "jsonl"'), ("= 256", "= 64"))
    err, page = _report(monkeypatch, capsys, [a, b, c], tmp_path / "o2")
    assert (
        err.startswith(
            "slipstream report: warning: the runs differ in eval.num_prompts, run.seed, "
            "schedule.name, task.kind; with different eval.num_prompts, task.kind their rewards "
            "and held-out accuracies are not on one scale"
        )
        and err.count("\n") == 1
    ), err
    assert "<tr><th>task.kind</th><td>builtin</td><td>builtin</td><td>jsonl</td></tr>" in page

    err, page = _report(monkeypatch, capsys, [RUN_SMALL, a], tmp_path / "o3")
    assert err == "" and 'class="notice"' not in page


def test_differing_settings_compares_only_runs_with_a_config(tmp_path: Path) -> None:
    def run(config: dict[str, Any]) -> RunData:
        return RunData(tmp_path, "r", [{"step": 1}], config)

    one = {"run": {"dir": "a", "seed": 0}, "model": {}, "wandb": {"project": "x"}}
    other = {"run": {"dir": "b", "seed": 0}, "model": {"path": "m"}, "wandb": {"project": "y"}}
    assert differing_settings([run(one), run({}), run(other)]) == ["model.path"]
    assert differing_settings([run(one), run({})]) == [] == differing_settings([run(one)])
    assert comparison_notice([run(one), run(other)]) == (
        "note: the runs differ in model.path (side by side in the summary table)"
    )
