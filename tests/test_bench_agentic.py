"""bench/agentic.py's lag distribution is summed from what step records hold."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import agentic as bench


def test_lag_counts_sum_the_step_histograms():
    # lag 0: 3 + 1, lag 1: 0 + 4, lag 2: 2; a step without a histogram (no training) adds none
    records = [{"staleness/lag_hist": [3, 0, 2]}, {"staleness/lag_hist": [1, 4]}, {"step": 3}]
    assert bench.lag_counts(records) == {"0": 4, "1": 4, "2": 2}
    assert bench.lag_counts([{"staleness/lag_hist": []}]) == {}


def test_paired_difference_and_its_standard_error():
    import agentic_paired

    # differences b - a: 0, +1, 0, -1 -> mean 0, sample variance (0+1+0+1)/3 = 2/3,
    # standard error sqrt(2/3 / 4) = 0.408...
    out = agentic_paired.paired([1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0])
    assert out["acc_a"] == out["acc_b"] == 0.5 and out["diff"] == 0.0
    assert abs(out["paired_se"] - (2 / 3 / 4) ** 0.5) < 1e-12
    assert (out["b_only"], out["a_only"]) == (1, 1)


def test_step_gap_compares_the_curves_at_the_steps_both_evaluated():
    def row(seed: int, sched: str, curve: list[list[float]]) -> dict:
        return {"tail": 30.0, "seed": seed, "schedule": sched, "curve": curve}

    rows = [
        # seed 0: steps 8 and 16 in both (step 0, the start, and step 24, one run's, left out):
        # pipeline - sync = (0.30 - 0.20 + 0.20 - 0.30) / 2 = 0.0
        row(0, "sync", [[0, 0.1], [8, 0.2], [16, 0.3], [24, 0.9]]),
        row(0, "pipeline", [[0, 0.5], [8, 0.3], [16, 0.2]]),
        # seed 1: -0.1 at step 8
        row(1, "sync", [[8, 0.4]]),
        row(1, "pipeline", [[8, 0.3]]),
        row(2, "sync", [[8, 0.4]]),  # seed 2: no pipeline run, no pair
    ]
    gap = bench.step_gap(rows, "sync", "pipeline", 30.0)
    assert gap is not None and set(gap["by_seed"]) == {"0", "1"}
    assert abs(gap["by_seed"]["0"]) < 1e-12 and abs(gap["by_seed"]["1"] + 0.1) < 1e-12
    assert abs(gap["mean"] + 0.05) < 1e-12
    assert bench.step_gap(rows[4:], "sync", "pipeline", 30.0) is None


def test_engine_busy_is_a_median_over_seeds_at_one_tail():
    # sync at tail 30, seeds 0-2: 0.20, 0.25, 0.30 (median 0.25); at tails 10 and 1, seed 0:
    # 0.8, 0.9. Pooling the five would give 0.30, a mix of tails.
    rows = [
        {"tail": 30.0, "seed": 0, "schedule": "sync", "engine_busy": 0.20},
        {"tail": 30.0, "seed": 1, "schedule": "sync", "engine_busy": 0.25},
        {"tail": 30.0, "seed": 2, "schedule": "sync", "engine_busy": 0.30},
        {"tail": 10.0, "seed": 0, "schedule": "sync", "engine_busy": 0.8},
        {"tail": 1.0, "seed": 0, "schedule": "sync", "engine_busy": 0.9},
        {"tail": 1.0, "seed": 0, "schedule": "pipeline", "engine_busy": None},
    ]
    at30 = bench.by_schedule(rows, "engine_busy", 30.0)
    assert at30 == {"sync": 0.25, "pipeline": None, "async": None}
    assert bench.by_schedule(rows, "engine_busy", 1.0)["sync"] == 0.9


def test_time_to_target_is_training_time_for_both_loops():
    """The same run (1 s steps, a 2 s evaluation after step 2 that reaches the target) as
    the in-process sync loop writes it (the record after its step's evaluation) and as the
    orchestrated loops do (before): the same time to target, evaluation excluded; the wall
    clock, kept beside it, counts that evaluation for sync only."""
    summary = {"heldout_acc_end": 0.5, "wall_s": 5.0, "heldout_acc_start": 0.1}
    summary["ledger"] = {"balanced": True}

    def res(in_wall: bool) -> dict:
        walls = [1.0, 4.0, 5.0] if in_wall else [1.0, 2.0, 5.0]
        recs = [{"step": i + 1, "wall_s": w, "time/eval_s": 0.0} for i, w in enumerate(walls)]
        recs[1] |= {"time/eval_s": 2.0, "heldout_acc": 0.5}
        return {"summary": summary, "records": recs, "eval_in_wall": in_wall}

    sync, pipeline = bench.measures(res(True), 0.4), bench.measures(res(False), 0.4)
    assert sync["time_to_target_s"] == pipeline["time_to_target_s"] == 2.0
    assert (sync["time_to_target_wall_s"], pipeline["time_to_target_wall_s"]) == (4.0, 2.0)
    assert bench.measures(res(True), 0.6)["time_to_target_s"] is None
    # the budget: the whole run's training time (5 s of wall less the 2 s evaluation), the
    # same for both loops
    assert sync["train_s"] == pipeline["train_s"] == 3.0


def test_reuse_reads_back_a_finished_run_of_the_same_config_and_trains_no_other(
    tmp_path, monkeypatch
):
    from slipstream.config import load_config
    from slipstream.config.load import dump_config

    folder = tmp_path / "tail30-seed0-sync"
    folder.mkdir()
    same = [
        "task.kind=builtin_tools", f'run.dir="{folder}"', "run.quiet=true", "run.seed=0",
        "env.tool_latency_median_s=0.1", "env.tool_latency_p99_s=3.0",
        'schedule.name="sync"', "run.steps=2",
    ]  # fmt: skip
    (folder / "config.toml").write_text(dump_config(load_config(None, same)))
    (folder / "summary.json").write_text(json.dumps({"steps": 2, "wall_s": 1.0}))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    trained: list[str] = []
    monkeypatch.setattr(
        "slipstream.run.sync.train_sync", lambda cfg: trained.append(cfg.run.dir) or {}
    )
    res = bench.run_one(folder, "sync", 0, 0.1, 30.0, ["run.steps=2"], reuse=True)
    assert res["summary"] == {"steps": 2, "wall_s": 1.0} and res["records"] == [{"step": 1}]
    assert trained == []
    # another budget is another run: trained, not read back
    bench.run_one(folder, "sync", 0, 0.1, 30.0, ["run.steps=3"], reuse=True)
    assert len(trained) == 1


def test_a_target_gain_is_added_to_the_runs_own_start():
    summary = {"heldout_acc_end": 0.3, "wall_s": 3.0, "heldout_acc_start": 0.2}
    summary["ledger"] = {"balanced": True}
    recs = [{"step": 1, "wall_s": 1.0, "heldout_acc": 0.23}, {"step": 2, "wall_s": 2.0}]
    recs.append({"step": 3, "wall_s": 3.0, "heldout_acc": 0.26})
    res = {"summary": summary, "records": recs, "eval_in_wall": False}
    # start 0.20 + 0.05: step 1's 0.23 is short of 0.25, step 3's 0.26 reaches it
    m = bench.measures(res, 0.9, gain=0.05)
    assert abs(m["target"] - 0.25) < 1e-12 and m["time_to_target_s"] == 3.0
    assert m["curve"] == [[0, 0.2], [1, 0.23], [3, 0.26]]  # the start, then each evaluation
    assert bench.measures(res, 0.9)["time_to_target_s"] is None  # the absolute 0.9: never


def test_speedup_bounds_censor_an_unreached_run_at_its_budget():
    # seed 0: both reached, 100 / 20 = 5; seed 1: sync never (budget 300 s), pipeline at
    # 50 s: at least 300 / 50 = 6; seed 2: pipeline never (budget 80 s), sync at 40 s: at most
    # 40 / 80 = 0.5. The median of three lies between the medians of (5, 6, 0) and (5, inf,
    # 0.5): [5, 5]: decided although two seeds are censored.
    def row(seed: int, sched: str, t: float | None, budget: float) -> dict:
        return {"tail": 30.0, "seed": seed, "schedule": sched, "time_to_target_s": t,
                "train_s": budget}  # fmt: skip

    rows = [
        row(0, "sync", 100.0, 400.0), row(0, "pipeline", 20.0, 90.0),
        row(1, "sync", None, 300.0), row(1, "pipeline", 50.0, 90.0),
        row(2, "sync", 40.0, 300.0), row(2, "pipeline", None, 80.0),
    ]  # fmt: skip
    per_seed = bench.seed_bounds(rows, "sync", "pipeline", 30.0)
    assert per_seed == [(5.0, 5.0), (6.0, math.inf), (0.0, 0.5)]
    assert bench.median_bounds(per_seed) == [5.0, 5.0]
    assert bench.speedup(rows, "sync", "pipeline", 30.0) is None  # the plain median: undecided
    # neither reached on seed 0 too: (0, inf), (6, inf), (0, 0.5) -> [0, inf]
    rows[0]["time_to_target_s"] = rows[1]["time_to_target_s"] = None
    assert bench.median_bounds(bench.seed_bounds(rows, "sync", "pipeline", 30.0)) == [
        0.0,
        math.inf,
    ]
    assert bench.finite_or_none([0.0, math.inf]) == [0.0, None]
    assert bench.median_bounds([]) is None


def test_measures_report_both_crossings():
    # start 0.20, target 0.25: 0.26 at step 1 is noise the next two fall back from; the
    # monotone curve pools (0.26, 0.21, 0.22) to 0.23 and crosses at step 4 (0.27)
    summary = {"heldout_acc_end": 0.27, "wall_s": 4.0, "heldout_acc_start": 0.20}
    summary["ledger"] = {"balanced": True}
    recs = [
        {"step": i + 1, "wall_s": float(i + 1), "heldout_acc": a}
        for i, a in enumerate([0.26, 0.21, 0.22, 0.27])
    ]
    res = {"summary": summary, "records": recs, "eval_in_wall": False}
    m = bench.measures(res, 0.25)
    assert (m["time_to_target_s"], m["time_to_target_monotone_s"]) == (4.0, 4.0)
    assert m["time_to_target_first_s"] == 1.0
    assert bench.measures(res, 0.25, crossing="first")["time_to_target_s"] == 1.0


def test_orchestrated_schedules_defer_evaluation_and_read_its_accuracies_back(
    tmp_path, monkeypatch
):
    """Evaluated in line, a pipeline's samplers generate while its trainer evaluates, and the
    clock takes the evaluation off: the bench defers it for every schedule but sync, and puts
    the deferred accuracies (summary.json's curve) into the step records it reads."""
    seen: dict[str, bool] = {}

    def fake(cfg):
        out = Path(cfg.run.dir)
        out.mkdir(parents=True, exist_ok=True)
        seen[cfg.schedule.name] = cfg.runtime.defer_eval
        (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "wall_s": 1.0}) + "\n")
        return {"heldout_curve": [{"step": 1, "wall_s": 1.0, "heldout_acc": 0.5}]}

    monkeypatch.setattr("slipstream.run.launch.train_async", fake)
    monkeypatch.setattr("slipstream.run.sync.train_sync", fake)
    pipe = bench.run_one(tmp_path / "p", "pipeline", 0, 0.1, 30.0, ["run.steps=1"])
    bench.run_one(tmp_path / "s", "sync", 0, 0.1, 30.0, ["run.steps=1"])
    assert seen == {"pipeline": True, "sync": False}
    assert pipe["records"] == [{"step": 1, "wall_s": 1.0, "heldout_acc": 0.5}]
    assert pipe["eval_in_wall"] is False


def test_lag_mean_is_over_trained_tokens_not_steps():
    # step 1 trained 1000 tokens at lag 0, step 2 ten tokens at lag 2: the run's mean lag over
    # its tokens is 20 / 1010 (summary.json's lag_mean), not the steps' plain mean, 1.0
    summary = {"heldout_acc_end": 0.3, "wall_s": 2.0, "heldout_acc_start": 0.2}
    summary["ledger"] = {"balanced": True}
    recs = [
        {"step": 1, "wall_s": 1.0, "staleness/lag_mean": 0.0, "staleness/lag_hist": [1000, 0, 0]},
        {"step": 2, "wall_s": 2.0, "staleness/lag_mean": 2.0, "staleness/lag_hist": [0, 0, 10]},
    ]
    res = {"summary": summary, "records": recs, "eval_in_wall": False}
    assert bench.measures(res, 0.25)["lag_mean"] == 20 / 1010
    assert bench.token_lag_mean([{"step": 1}]) == 0.0  # the in-process sync loop: no lag


def test_engine_busy_is_a_share_of_the_runs_time_not_a_mean_over_steps():
    # a 10 s step busy 10 % (waiting on a slow tool) and a 1 s step busy 90 %: the engine was
    # busy 1.9 s of 11 (0.173), not half the time (the steps' plain mean)
    recs = [
        {"step": 1, "wall_s": 10.0, "step_time_s": 10.0, "engine/busy_frac": 0.1},
        {"step": 2, "wall_s": 11.0, "step_time_s": 1.0, "engine/busy_frac": 0.9},
    ]
    summary = {"heldout_acc_end": 0.3, "wall_s": 11.0, "heldout_acc_start": 0.2}
    summary["ledger"] = {"balanced": True}
    res = {"summary": summary, "records": recs, "eval_in_wall": True}
    assert bench.measures(res, 0.25)["engine_busy"] == pytest.approx(1.9 / 11)
    orchestrated = [{"step": 1, "step_time_s": 3.0, "runtime/sampler_busy": 0.5}]
    assert bench.busy_share(orchestrated) == 0.5
    assert bench.busy_share(
        [{"engine/busy_frac": 0.2}, {"engine/busy_frac": 0.4}]
    ) == pytest.approx(0.3)
    assert bench.busy_share([{"step": 1}]) is None


def test_turns_mean_is_over_episodes_not_steps():
    # step 1 ran 2 episodes of 3 turns, step 2 thirty of 1 turn: 36 turns over 32 episodes
    # (1.125), not the steps' plain mean, 2.0; a step without episodes has no env/ metrics
    summary = {"heldout_acc_end": 0.3, "wall_s": 3.0, "heldout_acc_start": 0.2}
    summary["ledger"] = {"balanced": True}
    recs = [
        {"step": 1, "wall_s": 1.0, "env/turns_mean": 3.0, "env/episodes": 2},
        {"step": 2, "wall_s": 2.0, "env/turns_mean": 1.0, "env/episodes": 30},
        {"step": 3, "wall_s": 3.0},
    ]
    res = {"summary": summary, "records": recs, "eval_in_wall": False}
    assert bench.measures(res, 0.25)["turns_mean"] == 36 / 32
    assert bench.episode_turns_mean([{"step": 1}]) == 0.0
    # a count written as a float weighs as the int (observe.means.number, as the report reads)
    floats = [{**r, "env/episodes": float(r["env/episodes"])} for r in recs[:2]]
    assert bench.episode_turns_mean(floats) == 36 / 32


def test_schedule_set_groups_overrides_by_schedule_and_rejects_malformed_items():
    got = bench.schedule_sets(
        ["pipeline:schedule.max_lag=2", "async:schedule.max_lag=1", "pipeline:run.threads=2"]
    )
    assert got == {
        "pipeline": ["schedule.max_lag=2", "run.threads=2"],
        "async": ["schedule.max_lag=1"],
    }
    for bad in ("schedule.max_lag=2", "pipelines:schedule.max_lag=2", "pipeline:max_lag"):
        with pytest.raises(SystemExit, match="SCHEDULE:KEY=VALUE"):
            bench.schedule_sets([bad])


def test_final_gap_pairs_prompts_by_id_with_two_90_percent_half_widths():
    import agentic_final

    # by id, whatever the order; prompt means a: 0, 0.5, 1, 0.25 and b: 1, 0.5, 0.5, 0.75, so
    # differences b - a are +1, 0, -0.5, +0.5 -> mean 0.25, sample variance
    # (0.5625 + 0.0625 + 0.5625 + 0.0625) / 3 = 5/12, paired se sqrt(5/12 / 4)
    a = {"p1": [0.0, 0.0], "p2": [0.0, 1.0], "p3": [1.0, 1.0], "p4": [0.0, 0.5]}
    b = {"p4": [0.5, 1.0], "p3": [0.0, 1.0], "p2": [0.5, 0.5], "p1": [1.0, 1.0]}
    gap, prompts, samples = agentic_final.paired_gap(a, b)
    assert gap == 0.25 and math.isclose(prompts, 1.645 * (5 / 12 / 4) ** 0.5)
    # sample variances (n - 1): a 0, 0.5, 0, 0.125; b 0.125, 0.5, 0, 0 -> sum / 2 = 0.625
    assert math.isclose(samples, 1.645 * 0.625**0.5 / 4)
    with pytest.raises(SystemExit, match="different prompts"):
        agentic_final.paired_gap(a, {"p1": [1.0]})
    m = agentic_final.NAME.match("tail30-seed7-pipeline")
    assert m is not None and (m["tail"], m["seed"], m["schedule"]) == ("30", "7", "pipeline")
