"""Out-of-sample prediction on this machine: calibrate on recorded runs of one configuration,
predict another schedule and another batch size, compare with what those runs measured.

tests/data/simcal/ holds five real runs of the built-in task on the local runtime (30 steps,
seed 0, group size 8; recorded with `python bench/sim_calibration.py --write-test-data` on
this repository's shared 2-core CPU; metrics trimmed to the keys the calibration reads):
sync at batch 16 (the calibration run), pipeline at 16, sync at 32, pipeline at 32, and the
calibration run again a few minutes later. Only `sync_b16` is fitted.

Sampler busy is predicted within 10 % on every target. Step time is not: the errors are -66 %
(pipeline b16), -43 % (sync b32) and -62 % (pipeline b32), and the calibration run's own rerun
is off by +62 %: the same run's step time moved by 60 % with the machine's load (other jobs
share its two cores), so step time on this machine cannot show a 10 % model error either way.
The pipeline's miss is also structural (README, "Plan a cluster run"): its sampler and trainer
processes run at once on two cores, and its full continuous batches are a regime the sync run
(passes emptying as sequences finish) does not span.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slipstream.sim.calibrate import fit_profile, predict
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


@pytest.mark.xfail(strict=True, reason="step time measured -66/-43/-62 % off (module doc)")
@pytest.mark.parametrize("target", TARGETS)
def test_step_time_of_another_schedule_and_batch_within_10_percent(
    predictions: dict[str, dict[str, float]], target: str
) -> None:
    cmp = predictions[target]
    assert abs(cmp["step_time_err"]) < 0.10, cmp


def test_the_recorded_runs_are_what_the_doc_says() -> None:
    """The five folders hold the configurations named (schedule, batch, steps)."""
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
