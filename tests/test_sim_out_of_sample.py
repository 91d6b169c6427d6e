"""Out-of-sample prediction on this machine: calibrate on recorded runs of one configuration,
predict another schedule and another batch size, compare with what those runs measured.

tests/data/simcal/ holds five real runs of the built-in task on the local runtime (30 steps,
seed 0, group size 8; recorded with `python bench/sim_calibration.py --write-test-data` on
this repository's 2-core CPU with nothing else running; metrics trimmed to the keys the
calibration reads, the engine's forward-pass sums included): sync at batch 16 (the
calibration run), pipeline at 16, sync at 32, pipeline at 32, and the calibration run again a
few minutes later. Only `sync_b16` is fitted; its decode line comes from its forwards
(sim.calibrate, `fit_passes`).

Three recordings were made on the final code, one after another; the rule fixed before them
was that the last one becomes the test data. Step time error, pipeline 16 / sync 32 /
pipeline 32 (sampler busy within 6.3 % on all nine):

    recording 1   -5.7 / -6.0 / -3.3 %   (calibration run's own rerun: -9.9 %)
    recording 2   -9.3 / -3.7 / +4.9 %   (+9.9 %)
    recording 3   -7.3 / -0.9 / -0.1 %   (-12.0 %)   <- this data

Those three were simulated keeping groups older than the bound, while the runs dropped them
(the trainer's default); simulated as the runs did (`RunRecord.lag_policy`), this data gives
+0.5 / -0.9 / +8.8 % (-12.0 %), sampler busy -3.6 / +6.3 / -0.7 %.

Fitted from step totals instead (the fit without pass sums), the same recordings give
+1.4 / -0.7 / +4.4, -19.6 / -5.7 / -12.8 and -15.2 / -1.0 / -14.2 %: step totals cannot
separate the per-pass from the per-row cost (module doc of sim.calibrate), and the
pipeline's fewer, fuller forwards expose the split. The rerun's spread (about 10 %) is this
machine's run-to-run noise: a 10 % bound is at that floor, and the pipeline at batch 16 is
the closest to it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slipstream.sim.calibrate import fit_passes, fit_profile, predict
from slipstream.sim.runs import read_run

DATA = Path(__file__).parent / "data" / "simcal"
TARGETS = ("pipeline_b16", "sync_b32", "pipeline_b32")


@pytest.fixture(scope="module")
def predictions() -> dict[str, dict[str, float]]:
    cal = fit_profile(read_run(DATA / "sync_b16"))
    return {n: predict(cal, read_run(DATA / n)) for n in (*TARGETS, "sync_b16_again")}


@pytest.mark.parametrize("target", TARGETS)
def test_sampler_busy_of_another_schedule_and_batch_within_10_percent(
    predictions: dict[str, dict[str, float]], target: str
) -> None:
    cmp = predictions[target]
    assert abs(cmp["sampler_busy_err"]) < 0.10, cmp


def test_step_time_of_another_batch_size_within_10_percent(
    predictions: dict[str, dict[str, float]],
) -> None:
    cmp = predictions["sync_b32"]
    assert abs(cmp["step_time_err"]) < 0.10, cmp


@pytest.mark.parametrize("target", ("pipeline_b16", "pipeline_b32"))
def test_step_time_of_another_schedule_within_10_percent(
    predictions: dict[str, dict[str, float]], target: str
) -> None:
    cmp = predictions[target]
    assert abs(cmp["step_time_err"]) < 0.10, cmp


def test_the_recorded_runs_are_what_the_doc_says() -> None:
    """The five folders hold the configurations named (schedule, batch, steps), each step
    with the engine's forward-pass sums (so the pass fit, not the step fit, is tested)."""
    want = {
        "sync_b16": ("sync", 16),
        "pipeline_b16": ("pipeline", 16),
        "sync_b32": ("sync", 32),
        "pipeline_b32": ("pipeline", 32),
        "sync_b16_again": ("sync", 16),
    }
    for name, (schedule, batch) in want.items():
        run = read_run(DATA / name)
        assert (run.schedule, run.batch_prompts, len(run.metrics)) == (schedule, batch, 30)
        assert run.config["runtime"]["kind"] == "local"
        assert fit_passes(run.metrics) is not None
