"""Time to target on one clock (slipstream.observe.clock): the two loops' step records of
one and the same run, built by hand, give the same training time, evaluation excluded; the
wall clock counts one evaluation more for the in-process loop, which times a record after
its step's evaluation."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.observe.clock import (
    Reached,
    eval_inside,
    monotone_fit,
    time_to_target,
    training_times,
    training_total,
)

# one run: an evaluation at the start (3 s), steps of 1 s of training, evaluations of 2 s
# after steps 2 and 4, where the accuracy is 0.3 and then 0.5
START, STEP, EVAL = 3.0, 1.0, 2.0
ACC = {2: 0.3, 4: 0.5}


def records(eval_in_wall: bool) -> list[dict]:
    """The step records the in-process loop (`eval_in_wall`: evaluate, then time the record)
    or an orchestrated loop (time the record, then evaluate) writes for that run."""
    out, clock = [], START
    for step in (1, 2, 3, 4):
        clock += STEP
        evaluated = step in ACC
        if evaluated and eval_in_wall:
            clock += EVAL
        r = {"step": step, "wall_s": clock, "time/eval_s": EVAL if evaluated else 0.0}
        if evaluated:
            r["heldout_acc"] = ACC[step]
        if step == 1:
            r["time/eval_start_s"] = START
        out.append(r)
        if evaluated and not eval_in_wall:
            clock += EVAL
    return out


@pytest.mark.parametrize("eval_in_wall", [True, False], ids=["inprocess", "orchestrated"])
def test_both_orderings_give_the_training_time(eval_in_wall: bool) -> None:
    recs = records(eval_in_wall)
    assert training_times(recs, eval_in_wall) == [1.0, 2.0, 3.0, 4.0]
    hit = time_to_target(recs, 0.4, eval_in_wall)
    # the wall clock at step 4: 3 + 4 + 2 + 2 in-process, its own evaluation not yet in it
    # orchestrated (3 + 4 + 2)
    assert hit == Reached(4, 4.0, 11.0 if eval_in_wall else 9.0)
    assert time_to_target(recs, 0.3, eval_in_wall) == Reached(2, 2.0, 7.0 if eval_in_wall else 5.0)
    assert time_to_target(recs, 0.6, eval_in_wall) is None
    # the whole run: summary.json's wall_s comes after the last evaluation in both loops
    assert training_total(START + 4 * STEP + 2 * EVAL, recs) == 4.0


def test_the_orderings_differ_by_the_records_own_evaluation() -> None:
    inproc, orch = records(True), records(False)
    assert eval_inside(inproc, True) == [3.0, 5.0, 5.0, 7.0]
    assert eval_inside(orch, False) == [3.0, 3.0, 5.0, 5.0]
    # read with the other loop's ordering, the training time is off by that evaluation
    assert time_to_target(inproc, 0.4, False) == Reached(4, 6.0, 11.0)


def test_start_accuracy_records_without_eval_times_and_deferred_keys() -> None:
    recs = records(True)
    assert time_to_target(recs, 0.25, True, start_acc=0.25) == Reached(0, 0.0, 0.0)
    assert time_to_target(recs, 0.26, True, start_acc=0.25) == Reached(2, 2.0, 7.0)
    # a run written before `time/eval_s`: the wall clock
    old = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in recs]
    assert time_to_target(old, 0.4, True) == Reached(4, 11.0, 11.0)
    # the report's name for the accuracy is read too
    renamed = [{("eval/heldout_acc" if k == "heldout_acc" else k): v for k, v in r.items()}
               for r in recs]  # fmt: skip
    assert time_to_target(renamed, 0.4, True) == Reached(4, 4.0, 11.0)


def test_monotone_fit_golden_values() -> None:
    # pool adjacent violators by hand: 3 > 2 pools to 2.5; 5 > 1 pools to 3, then 2.5 <= 3
    assert monotone_fit([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert monotone_fit([1.0, 2.0, 5.0, 1.0]) == [1.0, 2.0, 3.0, 3.0]
    # one block pooled twice: [4, 1] -> 2.5, then 2.5 > 1 -> (4 + 1 + 1) / 3 = 2
    assert monotone_fit([4.0, 1.0, 1.0]) == [2.0, 2.0, 2.0]
    assert monotone_fit([]) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0), min_size=1, max_size=30))
def test_monotone_fit_is_the_nearest_non_decreasing_curve(values: list[float]) -> None:
    fit = monotone_fit(values)
    assert len(fit) == len(values)
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(fit))
    assert sum(fit) == pytest.approx(sum(values), abs=1e-9)  # each block keeps its mean
    assert monotone_fit(fit) == pytest.approx(fit)  # a non-decreasing curve is its own fit
    # no non-decreasing curve is nearer: not the sorted values, not the constant mean
    err = sum((f - v) ** 2 for f, v in zip(fit, values, strict=True))
    mean = sum(values) / len(values)
    assert err <= sum((mean - v) ** 2 for v in values) + 1e-9
    assert err <= sum((a - v) ** 2 for a, v in zip(sorted(values), values, strict=True)) + 1e-9


def curve(accs: list[float]) -> list[dict]:
    """Records of a run evaluated after every step, 1 s of training a step, no eval time."""
    return [{"step": i + 1, "wall_s": float(i + 1), "heldout_acc": a} for i, a in enumerate(accs)]


def test_monotone_crossing_ignores_a_spike_that_falls_back() -> None:
    # start 0.20, target 0.25: one evaluation at 0.26 (step 2) then 0.21, 0.22, then a rise
    recs = curve([0.21, 0.26, 0.21, 0.22, 0.27, 0.28])
    first = time_to_target(recs, 0.25, eval_in_wall=False, start_acc=0.20)
    assert first is not None and first.step == 2  # as measured: the spike
    fit = time_to_target(recs, 0.25, eval_in_wall=False, start_acc=0.20, monotone=True)
    # fitted: 0.20, 0.21, then (0.26 + 0.21 + 0.22) / 3 = 0.23 for steps 2-4, 0.27, 0.28
    assert fit is not None and (fit.step, fit.train_s) == (5, 5.0)
    # a spike the later evaluations hold up is a crossing for both
    held = curve([0.21, 0.26, 0.25, 0.27])
    hit = time_to_target(held, 0.25, eval_in_wall=False, start_acc=0.20, monotone=True)
    assert hit is not None and hit.step == 2
    # never above the target: never reached, either way
    assert time_to_target(curve([0.2, 0.24, 0.22]), 0.25, False, 0.2, monotone=True) is None
