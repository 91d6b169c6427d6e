"""Out-of-sample prediction on this machine: calibrate on recorded runs of one configuration,
predict another schedule and another batch size, compare with what those runs measured.

tests/data/simcal/ holds five real runs of the built-in task on the local runtime (30 steps,
seed 0, group size 8; recorded with `python bench/sim_calibration.py --write-test-data` on
this workplace's 2-core CPU at stop 25 with nothing else running; metrics trimmed to the keys
the calibration reads, the engine's forward-pass sums included): sync at batch 16 (the
calibration run), pipeline at 16, sync at 32, pipeline at 32, and the calibration run again a
few minutes later. Only `sync_b16` is fitted; its decode line comes from its forwards
(sim.calibrate, `fit_passes`), its cost per key read is scaled by the keys its forwards read
over those the simulator counts (`context_scale`), and each prediction is the mean of 64
simulations of the run's own 30 steps, its end included (`SimConfig.drain`); the figures
below were read with 8 (stop 25; with 64 this data reads +7.0 / +0.5 / +2.2 %, busy -4.5 /
+5.4 / -2.8 %).

Three recordings were made one after another on the final code; the rule fixed before them
was that the last one becomes the test data. Step time error, pipeline 16 / sync 32 /
pipeline 32 (the calibration run's own rerun; sampler busy):

    recording 1   +9.8 / +3.9 / +21.3 %   (+4.3 %; busy -3.3 / +10.2 / -1.7 %)
    recording 2   +5.9 / -1.5 / +22.7 %   (+6.1 %; busy -3.1 / +8.1 / -1.8 %)
    recording 3   +6.7 / -0.1 /  +2.0 %   (-1.1 %; busy -4.4 / +5.4 / -2.9 %)   <- this data

So within 10 % here on this data, not on every recording of this machine: the pipeline at
batch 32 misses by 21-23 % on two of three. Its forwards compute about 420 rows each, the
calibration run's at most 128 decode rows (and one prefill forward a step), and the decode
line fitted there overshoots their measured cost by 14-15 % on those two recordings (by -4 to
+4 % on the others); the four recordings of this machine (a first one, made before these
three, is where the model's changes were found) fit a cost per forward of 1.7 to 3.3 ms.

tests/data/simcal_earlier/ holds the same five runs recorded on an earlier 2-core CPU of
this workplace (commit 95b66e9, 2026-12-01); there the same model gives +11.0 / +7.4 / +21.8 %
(-7.0 %), sampler busy -4.0 / +8.6 / -1.6 %: that CPU's large forwards ran 9-13 % below the
sync run's line, and its calibration run's rerun 8.5 % above it. Until stop 25 the simulator
counted 1.28x fewer keys read than the forwards (every prompt at the mean length), which on
that data happened to offset the line's overshoot (+0.5 / -0.9 / +8.8 %), while on this
machine's first recording it left every target short (-9.1 / -10.9 / -4.6 %; now +1.7 / -3.4 /
+7.8 %).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchload import load_bench
from slipstream.sim.calibrate import context_scale, fit_passes, fit_profile, predict
from slipstream.sim.runs import read_run

DATA = Path(__file__).parent / "data" / "simcal"
EARLIER = Path(__file__).parent / "data" / "simcal_earlier"
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
        for data in (DATA, EARLIER):
            run = read_run(data / name)
            assert (run.schedule, run.batch_prompts, len(run.metrics)) == (schedule, batch, 30)
            assert run.config["runtime"]["kind"] == "local"
            assert fit_passes(run.metrics) is not None


@pytest.mark.parametrize("data", [DATA, EARLIER], ids=["this", "earlier"])
def test_keys_read_per_key_counted_carry_over_to_another_batch_size(data: Path) -> None:
    """The context correction measured on the calibration run holds out of sample: the sync
    run at batch 32 reads keys at the same rate over the simulator's count (within 3 %), on
    both CPUs, and that rate is well above 1 (the built-in task's longer prompts have longer
    completions)."""
    source = context_scale(read_run(data / "sync_b16").metrics)
    other = context_scale(read_run(data / "sync_b32").metrics)
    assert source > 1.2
    assert abs(other / source - 1) < 0.03


def test_forward_line_check_on_the_recorded_runs() -> None:
    """The bench's `line` column: the calibration run's forward line on a target's forwards.
    On its own run the least-squares line's residuals sum to zero (the intercept's normal
    equation, its coefficient being positive here), so the check reads 0 there; on the test
    data's targets it reads what the bench printed when the data was recording s25d (+3.6 /
    -1.0 / -3.7 %)."""
    bench = load_bench("sim_calibration")
    source = read_run(DATA / "sync_b16").metrics
    assert bench.forward_line_err(source, source) == pytest.approx(0.0, abs=1e-9)
    got = {n: bench.forward_line_err(source, read_run(DATA / n).metrics) for n in TARGETS}
    want = {"pipeline_b16": 0.036, "sync_b32": -0.010, "pipeline_b32": -0.037}
    for n, w in want.items():
        assert got[n] == pytest.approx(w, abs=0.0015), (n, got[n])
    assert bench.forward_line_err(source, [{"step_time_s": 1.0}]) is None


def test_train_line_check_golden() -> None:
    """The bench's `train` column: the calibration run's training line (fitted on its steps
    after the first) on a target's steps after the first. Hand-derived: the source's steps lie
    on 0.01 + 0.001 * tokens (its first step, 5 s, is left out), so a target that trained 100
    and 300 tokens in 0.22 and 0.42 s is predicted 0.11 + 0.31 = 0.42 s of 0.64: -34.375 %."""
    bench = load_bench("sim_calibration")
    source = [{"tokens/trained": 50.0, "time/train_s": 5.0}] + [
        {"tokens/trained": t, "time/train_s": 0.01 + 0.001 * t} for t in (100.0, 200.0, 400.0)
    ]
    target = [
        {"tokens/trained": 1.0, "time/train_s": 9.0},
        {"tokens/trained": 100.0, "time/train_s": 0.22},
        {"tokens/trained": 300.0, "time/train_s": 0.42},
    ]
    assert bench.train_line_err(source, target) == pytest.approx(0.42 / 0.64 - 1, abs=1e-9)
    assert bench.train_line_err(source, source) == pytest.approx(0.0, abs=1e-9)


def test_host_probe_reads_proc_stat(tmp_path: Path) -> None:
    """`cpu_jiffies` sums the first line's eight fields (user, nice, system, idle, iowait, irq,
    softirq, steal; guest fields after them are already in user) and counts all but idle and
    iowait as busy; `busy_cores` turns two readings into cores: 100 busy jiffies of 200 on a
    2-core host is one core."""
    bench = load_bench("sim_calibration")
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 40 800 50 3 2 10 7 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert bench.cpu_jiffies(str(stat)) == (160.0, 1010.0)
    assert bench.busy_cores((160.0, 1010.0), (260.0, 1210.0), 2) == pytest.approx(1.0)
    assert bench.busy_cores((1.0, 5.0), (1.0, 5.0), 2) == 0.0


@pytest.mark.slow  # about 5 s: 12 predictions of 64 simulations
def test_consistency_a_recording_pooled_with_itself_is_that_recording(tmp_path: Path) -> None:
    """Consistency check (the inputs come back): the bench's pooled comparison of two copies
    of one recording measures what the recording alone does, and its lines (fitted on the
    rows twice) read the same; its predictions differ only by the Monte Carlo error of other
    draws of lengths (from a pool holding each group twice): within 2 % here."""
    bench = load_bench("sim_calibration")
    folders = bench.seed_folders(tmp_path, [3, 4])
    assert folders == {3: tmp_path / "seed3", 4: tmp_path / "seed4"}
    assert bench.seed_folders(tmp_path, [3]) == {3: tmp_path}
    for f in folders.values():
        shutil.copytree(DATA, f)
    pooled, alone = bench.compare_pooled(list(folders.values())), bench.compare(DATA)
    for n in (*TARGETS, "sync_b16_again"):
        for k in ("step_time_s", "sampler_busy", "forward_line_err", "train_line_err"):
            assert pooled[n][k] == pytest.approx(alone[n][k], rel=1e-9), (n, k)
        for k in ("step_time_s_pred", "sampler_busy_pred"):
            assert pooled[n][k] == pytest.approx(alone[n][k], rel=0.02), (n, k)
