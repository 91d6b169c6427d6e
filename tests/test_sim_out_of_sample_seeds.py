"""Out-of-sample prediction over three seeds: calibrate on one configuration's runs of every
seed together, predict the mean step time and sampler busy of another schedule and another
batch size over the same seeds.

tests/data/simcal_seeds/seed{0,1,2}/ hold the five runs of tests/data/simcal (sync and
pipeline at batch 16 and 32, 30 steps, the calibration run again last) for seeds 0, 1 and 2,
recorded seed after seed with `python bench/sim_calibration.py --seeds 0,1,2
--write-test-data` on this workplace's 2-core AMD EPYC CPU at stop 41, the host probed quiet
(at most 0.03 cores busy with other processes); the rule fixed before the recording was that
the first three-seed recording becomes this data, and that the pooled comparison is the
headline. One seed's prompts are the same in every configuration, so a run-to-run difference
of the task repeats on every recording of that seed; pooling the seeds keeps one draw of
prompts out of the figure.

The bench printed (step time error; sampler busy error), pooled: pipeline 16 +3.7 % (-3.8 %),
sync 32 -6.0 % (+9.6 %), pipeline 32 +4.2 % (-1.8 %), the calibration configuration's rerun
-4.6 % (+3.4 %). Each seed calibrated on its own sync 16 run: step time -1.4 to +8.8 % at
pipeline 16, -9.1 to -2.6 % at sync 32, -0.6 to +12.2 % at pipeline 32; sampler busy +7.6 to
+13.0 % at sync 32. That last residual is no seed's accident: on every seed the calibration
run kept the smallest share of its generated tokens for training (the filters drop the groups
whose rewards are all equal; 0.150 / 0.109 / 0.175 at sync 16 against 0.186 / 0.166 / 0.229 at
sync 32), the simulator trains the calibration run's share, so it predicts sync 32's training
short and its sampler busier than it was.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchload import load_bench

DATA = Path(__file__).parent / "data" / "simcal_seeds"
SEEDS = (0, 1, 2)
pytestmark = pytest.mark.slow  # the pooled comparison: about 5 s
TARGETS = ("pipeline_b16", "sync_b32", "pipeline_b32")


@pytest.fixture(scope="module")
def pooled() -> dict[str, dict[str, float | None]]:
    bench = load_bench("sim_calibration")
    return bench.compare_pooled([DATA / f"seed{s}" for s in SEEDS])


@pytest.mark.parametrize("target", TARGETS)
def test_pooled_step_time_and_sampler_busy_within_10_percent(
    pooled: dict[str, dict[str, float]], target: str
) -> None:
    cmp = pooled[target]
    assert abs(cmp["step_time_err"]) < 0.10, cmp
    assert abs(cmp["sampler_busy_err"]) < 0.10, cmp


def _trained_share(run: Path) -> float:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return sum(r["tokens/trained"] for r in rows) / sum(r["tokens/generated"] for r in rows)


def test_the_calibration_run_trains_the_smallest_share_on_every_seed() -> None:
    """What the doc says of sync 32's sampler busy: on each seed the calibration run's trained
    share of generated tokens is below sync 32's (by 0.036 to 0.057), so the residual is the
    task's dynamics at another batch size, not one seed's prompts."""
    for s in SEEDS:
        source = _trained_share(DATA / f"seed{s}" / "sync_b16")
        other = _trained_share(DATA / f"seed{s}" / "sync_b32")
        assert 0.03 < other - source < 0.06, (s, source, other)


def test_the_recorded_runs_are_what_the_doc_says() -> None:
    for s in SEEDS:
        for name, (schedule, batch) in load_bench("sim_calibration").RUNS.items():
            config = (DATA / f"seed{s}" / name / "config.toml").read_text()
            assert f"seed = {s}\n" in config and f'name = "{schedule}"' in config
            assert f"batch_prompts = {batch}\n" in config and "steps = 30\n" in config
