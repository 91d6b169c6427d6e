"""Out-of-sample prediction on this machine: calibrate on recorded runs of one configuration,
predict another schedule and another batch size, compare with what those runs measured.

tests/data/simcal/ holds five real runs of the built-in task on the local runtime (30 steps,
seed 0, group size 8; recorded with `python bench/sim_calibration.py --write-test-data` on
this repository's 2-core CPU, with one steady low-priority job on the other core; metrics
trimmed to the keys the calibration reads): sync at batch 16 (the calibration run), pipeline
at 16, sync at 32, pipeline at 32, and the calibration run again a few minutes later. Only
`sync_b16` is fitted.

Sampler busy is predicted within 10 % on every target (-3.1 / +6.8 / -1.7 %), and the step
time of sync at the other batch size too (-8.1 %). The pipeline's step time is not: -47 % at
batch 16, -53 % at 32 (the calibration run's own rerun is off by -10.6 %: the machine's noise
floor). The miss is structural (README, "Plan a cluster run"): the pipeline's sampler and
trainer processes run at once on two cores, and the runs show what that costs, which a sync
run cannot show: training ran at 930 tokens/s in the pipeline against 2,150-2,220 in sync,
and generation at 3,020-3,070 tokens/s against 2,800-3,015, although the pipeline's batches
are full (the simulator, fitted on sync's passes, expects them to be much faster).
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


def test_step_time_of_another_batch_size_within_10_percent(
    predictions: dict[str, dict[str, float]],
) -> None:
    cmp = predictions["sync_b32"]
    assert abs(cmp["step_time_err"]) < 0.10, cmp


@pytest.mark.xfail(strict=True, reason="pipeline step time measured -47 / -53 % off (module doc)")
@pytest.mark.parametrize("target", ("pipeline_b16", "pipeline_b32"))
def test_step_time_of_another_schedule_within_10_percent(
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
