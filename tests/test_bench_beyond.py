"""bench/beyond.py's auto-vs-fixed ratio says when a median "time to target" is in fact the
wall time of a run that never reached the target."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import beyond as bench


def _run(t: float, reached: bool, acc: float = 0.2) -> dict:
    return {"time_to_target": t, "reached": reached, "acc": acc, "ess_mean": 1.0}


def test_a_median_that_is_an_unreached_runs_wall_time_is_flagged():
    # auto: 5.5 reached, 21.8 and 30.0 not (wall times): its median, 21.8, is a budget's wall
    # time. K=8: 4.9 and 20.0 reached, 27.4 not: its median, 20.0, is a time to target.
    res = {
        "K=8": [_run(4.9, True), _run(20.0, True), _run(27.4, False)],
        "auto": [_run(5.5, True), _run(21.8, False), _run(30.0, False)],
    }
    _, ratio = bench.auto_table(res, 0.25)
    assert ratio["best_fixed_time"] == "K=8"
    assert ratio["time_ratio"] == 21.8 / 20.0
    assert ratio["time_median_reached"] == {"auto": False, "K=8": True}


def test_median_reached_with_an_even_count_needs_both_middle_runs():
    assert bench.median_reached([_run(1, True), _run(2, True), _run(3, True), _run(4, False)])
    assert not bench.median_reached([_run(1, True), _run(2, False), _run(3, True), _run(4, True)])


def test_a_stopped_run_is_counted_not_medianed():
    stopped = {"time_to_target": None, "reached": False, "acc": None, "ess_mean": None}
    res = {
        "K=8": [_run(4.0, True), _run(6.0, True), dict(stopped)],
        "auto": [_run(5.0, True), _run(7.0, True), _run(9.0, True)],
    }
    text, ratio = bench.auto_table(res, 0.25)
    assert "| K=8 | 5.0 (4.0-6.0) | 2/3, 1 stopped |" in text
    assert ratio["time_ratio"] == 7.0 / 5.0
    _, none = bench.auto_table({"K=8": [dict(stopped)], "auto": [_run(5.0, True)]}, 0.25)
    assert none["time_ratio"] is None


def test_paired_differences_are_per_seed_points_with_a_bootstrap_interval():
    # seeds 0-2: auto 0.30, 0.20, 0.25 against K=8's 0.28, 0.25, 0.25: +2, -5, 0 points
    # (mean -1); seed 3 ran for auto only, so it is not paired
    res = {
        "K=8": [{"seed": s, "acc": a} for s, a in ((0, 0.28), (1, 0.25), (2, 0.25))],
        "auto": [{"seed": s, "acc": a} for s, a in ((0, 0.30), (1, 0.20), (2, 0.25), (3, 0.9))],
    }
    p = bench.paired(res, "K=8")
    assert p["diffs"] == [2.0, -5.0, 0.0] and abs(p["mean"] + 1.0) < 1e-12
    lo, hi = p["interval90"]
    assert -5.0 <= lo <= p["mean"] <= hi <= 2.0  # bootstrap means lie within the data's range
    assert bench.paired({"K=8": [], "auto": res["auto"]}, "K=8")["mean"] is None


def test_a_target_gain_sets_each_runs_target_from_its_own_start():
    from argparse import Namespace

    assert bench.run_target(Namespace(target=0.25, target_gain=None), 0.1) == 0.25
    assert abs(bench.run_target(Namespace(target=0.25, target_gain=0.06), 0.102) - 0.162) < 1e-12


def test_lag_policy_summary_pairs_every_policy_with_the_first():
    """bench/lag_policy.py: medians over the runs that finished (a stopped run is counted, not
    medianed), reached counts, and keep minus drop per seed: seeds 0-2 at 0.30 / 0.20 / 0.26
    dropped and 0.25 / 0.21 / 0.26 kept give -5, +1, 0 points."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import lag_policy

    def run(seed: int, acc: float | None, t: float, reached: bool) -> dict:
        return {"seed": seed, "acc": acc, "time_to_target": t, "reached": reached}

    res = {
        "drop": [run(0, 0.30, 4.0, True), run(1, 0.20, 9.0, False), run(2, 0.26, 5.0, True)],
        "keep": [run(0, 0.25, 6.0, True), run(1, 0.21, 3.0, True), run(2, 0.26, 8.0, True)],
    }
    res["keep"].append({"seed": 3, "acc": None, "time_to_target": None, "reached": False})
    s = lag_policy.summarize(res)
    assert s["drop"] == {"acc_median": 0.26, "time_to_target_median": 5.0,
                         "time_median_reached": True, "reached": 2, "runs": 3}  # fmt: skip
    assert s["keep"]["acc_median"] == 0.25 and s["keep"]["reached"] == 3
    assert s["keep"]["runs"] == 4 and s["keep"]["time_to_target_median"] == 6.0
    p = s["acc_paired_points"]["keep"]
    assert p["diffs"] == [-5.0, 1.0, 0.0] and abs(p["mean"] + 4 / 3) < 1e-12
    assert set(s["acc_paired_points"]) == {"keep"}


def test_a_diagnostic_start_is_reported_beside_auto_never_as_a_fixed_k():
    res = {
        "K=2": [_run(8.0, True), _run(10.0, True)],
        "auto": [_run(12.0, True), _run(14.0, True)],
        "auto@2": [_run(2.0, True), _run(4.0, True)],  # faster than any K: still not "fixed"
    }
    assert bench.auto_name(bench.DEFAULT_START) == "auto"
    other = bench.DEFAULT_START + 1
    assert bench.auto_name(other) == f"auto@{other}"
    _, ratio = bench.auto_table(res, 0.25)
    assert ratio["best_fixed_time"] == "K=2" and ratio["time_ratio"] == 13.0 / 9.0
    assert ratio["auto@2_time_ratio"] == 3.0 / 9.0


def test_auto_lag_met_needs_reached_medians_and_no_stopped_run():
    """`auto_lag_met` compares times to target: not where a compared median time is an
    unreached run's whole training time, nor where a compared configuration's stopped
    (collapsed) run was left out of its medians."""
    k8 = [_run(4.9, True), _run(20.0, True), _run(27.4, True)]
    met = {"K=8": k8, "auto": [_run(5.5, True), _run(20.5, True), _run(30.0, True)]}
    _, ratio = bench.auto_table(met, 0.25)
    assert ratio["time_ratio"] == 20.5 / 20.0 and bench.auto_lag_met(ratio)
    # auto's median, 20.5, is the budget of a run that never got there: 1.025 "within 5 %"
    # compares a budget with a time to target
    unreached = {"K=8": k8, "auto": [_run(5.5, True), _run(20.5, False), _run(30.0, False)]}
    _, ratio = bench.auto_table(unreached, 0.25)
    assert ratio["time_ratio"] == 20.5 / 20.0 and ratio["time_median_reached"]["auto"] is False
    assert not bench.auto_lag_met(ratio)
    # auto collapsed on one seed: its medians are over the two seeds left (6.0 s)
    stopped = {"time_to_target": None, "reached": False, "acc": None, "ess_mean": None}
    collapsed = {"K=8": k8, "auto": [_run(5.0, True), _run(7.0, True), dict(stopped)]}
    _, ratio = bench.auto_table(collapsed, 0.25)
    assert ratio["time_ratio"] == 6.0 / 20.0 and ratio["stopped"]["auto"] == 1
    assert not bench.auto_lag_met(ratio)
    # ... and so where the best fixed K's run stopped
    _, ratio = bench.auto_table({"K=8": [*k8, dict(stopped)], "auto": met["auto"]}, 0.25)
    assert ratio["stopped"] == {"auto": 0, "K=8": 1} and not bench.auto_lag_met(ratio)
    assert not bench.auto_lag_met({"time_ratio": None, "acc_ratio": None})


def test_lag_policy_says_when_its_median_time_is_an_unreached_runs_budget():
    """bench/lag_policy.py: drop's median time, 9.0, is a run that never reached the target
    (its whole training time), as bench/beyond.py flags its own (`time_median_reached`)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import lag_policy

    res = {
        "drop": [_run(4.0, True), _run(9.0, False), _run(9.5, False)],
        "keep": [_run(3.0, True), _run(5.0, True), _run(9.0, False)],
    }
    for runs in res.values():
        for seed, r in enumerate(runs):
            r["seed"] = seed
    s = lag_policy.summarize(res)
    assert s["drop"]["time_to_target_median"] == 9.0
    assert s["drop"]["time_median_reached"] is False
    assert s["keep"]["time_median_reached"] is True


def test_the_bootstrap_redraws_seeds_for_every_configuration_alike():
    # Every configuration's time is its seed's number + a constant, so on any draw of seeds the
    # medians keep their order: K=2 always the fastest fixed K, auto always 1 s behind it,
    # whatever the draw; the ratio varies only with the draw's median seed (10..14 -> 11..15).
    res = {
        name: [{"seed": s, "acc": 0.3, "time_to_target": s + d} for s in range(10, 15)]
        for name, d in (("K=1", 3.0), ("K=2", 0.0), ("auto", 1.0))
    }
    res["auto"].append({"seed": 99, "acc": 0.9, "time_to_target": 1.0})  # unpaired: left out
    b = bench.ratio_bootstrap(res)
    assert b["seeds"] == 5 and b["fastest_share"] == {"K=1": 0.0, "K=2": 1.0}
    lo, hi = b["time_ratio_interval90"]
    assert 15 / 14 <= lo <= hi <= 11 / 10
    assert b["acc_ratio_interval90"] == [1.0, 1.0]
    assert b["met_share"] == 0.0  # 11/10 at best: never within 5 %
    res["auto"] = [{**r, "time_to_target": r["time_to_target"] - 1.0} for r in res["auto"]]
    assert bench.ratio_bootstrap(res)["met_share"] == 1.0  # auto equal to K=2 on every draw
    assert bench.ratio_bootstrap({"K=2": res["K=2"][:1], "auto": res["auto"][:1]}) == {"seeds": 1}


def test_null_met_share_is_the_hand_derived_chance_of_a_configuration_like_the_fixed_ks():
    """One seed a column, times 1 or 10 s alike (accuracies equal): a fifth column drawn like
    the four meets "within 5 % of the fastest" when it draws 1 s (1/2), or 10 s with all four
    fixed columns at 10 s too (1/2 x 1/16): 17/32 = 0.531. And when every run is alike, always."""
    pool = [{"time_to_target": t, "acc": 0.3} for t in (1.0, 10.0)]
    assert abs(bench.null_met_share(pool, 1, reps=8000) - 17 / 32) < 0.02
    assert bench.null_met_share([{"time_to_target": 5.0, "acc": 0.3}], 15, reps=50) == 1.0
    # accuracy too: a column at 0.2 against a best of 0.3 misses (0.2 < 0.95 x 0.3)
    mixed = [{"time_to_target": 5.0, "acc": a} for a in (0.2, 0.3)]
    assert abs(bench.null_met_share(mixed, 1, reps=8000) - 17 / 32) < 0.02


def test_the_monotone_ratio_is_reported_beside_only_when_every_run_has_it():
    def run(t: float, fit: float) -> dict:
        return {**_run(t, True), "time_to_target_monotone": fit}

    res = {"K=2": [run(4.0, 9.0), run(6.0, 11.0)], "K=8": [run(3.0, 8.0), run(5.0, 12.0)],
           "auto": [run(5.0, 9.0), run(7.0, 12.0)]}  # fmt: skip
    _, ratio = bench.auto_table(res, 0.25)
    # first crossings: auto 6.0 against K=8's 4.0; fits: auto 10.5 against K=8's (and K=2's) 10.0
    assert ratio["time_ratio"] == 6.0 / 4.0 and ratio["time_ratio_monotone"] == 10.5 / 10.0
    res["K=2"][0].pop("time_to_target_monotone")  # a run read back from an older results.json
    assert bench.auto_table(res, 0.25)[1]["time_ratio_monotone"] is None


def test_seconds_a_step_and_steps_to_target_are_reported_beside_the_target():
    """Time to target = steps to it x seconds a step, each ratio auto's median over the
    smallest fixed K's median, hand-derived below; absent from an older run: None."""

    def run(t: float, step_s: float, steps: int) -> dict:
        return {**_run(t, True), "step_s": step_s, "steps_to_target": steps}

    res = {"K=2": [run(4.0, 0.40, 10), run(6.0, 0.30, 20)],
           "K=8": [run(3.0, 0.25, 12), run(5.0, 0.27, 18)],
           "auto": [run(5.0, 0.26, 16), run(7.0, 0.30, 24)]}  # fmt: skip
    _, ratio = bench.auto_table(res, 0.25)
    # medians: s/step K=2 0.35, K=8 0.26, auto 0.28; steps K=2 15, K=8 15, auto 20
    assert abs(ratio["step_time_ratio"] - 0.28 / 0.26) < 1e-12
    assert ratio["steps_ratio"] == 20 / 15
    res["auto"][1].pop("step_s")
    assert bench.auto_table(res, 0.25)[1]["step_time_ratio"] is None
