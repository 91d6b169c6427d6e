"""Time to target on one clock (slipstream.observe.clock): the two loops' step records of
one and the same run, built by hand, give the same training time, evaluation excluded; the
wall clock counts one evaluation more for the in-process loop, which times a record after
its step's evaluation."""

from __future__ import annotations

import pytest

from slipstream.observe.clock import (
    Reached,
    eval_inside,
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
