"""A run's weighted step means (slipstream.observe.means): shared by `slipstream report` and
the bench scripts, and light to import (no matplotlib), so the scripts' `--help` stays fast."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slipstream.observe import report
from slipstream.observe.means import lag_tokens, number, weighted_mean

ROOT = Path(__file__).resolve().parents[1]


def _imports_matplotlib(code: str) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print('matplotlib' in sys.modules)"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    return out.stdout.strip() == "True"


def test_the_means_import_no_matplotlib():
    assert not _imports_matplotlib("import slipstream.observe.means")


def test_the_bench_scripts_that_use_them_import_no_matplotlib_at_load():
    for name in ("agentic", "staleness"):
        load = f"import sys; sys.path.insert(0, 'tests'); import benchload; benchload.load_bench({name!r})"
        assert not _imports_matplotlib(load), name


def test_report_reads_the_same_functions():
    assert report.weighted_mean is weighted_mean and report.lag_tokens is lag_tokens


def test_number_takes_ints_and_floats_but_no_bool():
    assert number(3) == 3.0 and number(0.5) == 0.5
    assert number(True) is None and number("1") is None and number(None) is None


def test_weighted_mean_and_lag_tokens():
    assert weighted_mean([]) is None
    assert weighted_mean([(1.0, 1.0), (3.0, 3.0)]) == pytest.approx(2.5)
    assert weighted_mean([(1.0, 1.0), (3.0, None)]) == 2.0  # a value without weight: plain
    assert lag_tokens({"staleness/lag_hist": [2, 0, 3]}) == 5.0
    assert lag_tokens({"staleness/lag_hist": [2, True]}) is None and lag_tokens({}) is None
