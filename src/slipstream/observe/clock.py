"""Training time, evaluation excluded: one clock for the step records of every loop.

A step record's `wall_s` is the run's clock when the record was made, and it holds the
held-out evaluations made before that moment. The loops differ in when that is: the
in-process `sync` loop evaluates a step and then makes its record (`eval_in_wall=True`: the
record's `wall_s` holds its own evaluation), the orchestrated loops (every schedule on the
local or Ray runtime, and `slipstream replay`) make the record and then evaluate
(`eval_in_wall=False`). So the wall clock at the first record that reaches a target
accuracy counts one evaluation more for the in-process loop than for the others.

Each record carries `time/eval_s`, the seconds of its step's held-out evaluation (0 where
the step had none; with `runtime.defer_eval` the weight snapshot's write, which is all the
evaluation takes from the run), and the first record of a run that evaluated at its start
carries `time/eval_start_s`, that evaluation's seconds (inside the first record's `wall_s`
in both loops). `training_times` takes off each record's `wall_s` the evaluation seconds it
holds: the start's, every earlier record's and, with `eval_in_wall`, its own. That is the
time the run trained, evaluation excluded, on which loops compare. (The samplers of an
orchestrated run keep generating while its trainer evaluates; taking evaluations off that
clock credits them that overlap, which inline evaluation gives them.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slipstream.observe.means import number
from slipstream.observe.runs import HELDOUT_KEYS

EVAL_S = "time/eval_s"
EVAL_START_S = "time/eval_start_s"


@dataclass(frozen=True)
class Reached:
    """Where a run first reached a target: its step, its training time (evaluation excluded)
    and its wall clock (evaluations included) there."""

    step: int
    train_s: float
    wall_s: float


def _num(record: Mapping[str, Any], key: str) -> float:
    return number(record.get(key)) or 0.0


def eval_inside(records: Sequence[Mapping[str, Any]], eval_in_wall: bool) -> list[float]:
    """Per record (in the order written), the evaluation seconds its `wall_s` holds (module
    doc); records without `time/eval_s` (older runs) count none."""
    out, before = [], 0.0
    for r in records:
        before += _num(r, EVAL_START_S)
        own = _num(r, EVAL_S)
        out.append(before + (own if eval_in_wall else 0.0))
        before += own
    return out


def training_times(records: Sequence[Mapping[str, Any]], eval_in_wall: bool) -> list[float]:
    """Per record, `wall_s` minus the evaluation seconds it holds: training time so far."""
    return [
        _num(r, "wall_s") - e
        for r, e in zip(records, eval_inside(records, eval_in_wall), strict=True)
    ]


def training_total(wall_s: float, records: Sequence[Mapping[str, Any]]) -> float:
    """A whole run's training time: its wall clock at the end (summary.json's `wall_s`, taken
    after the last evaluation in both loops) minus every evaluation of its records."""
    return wall_s - sum(_num(r, EVAL_START_S) + _num(r, EVAL_S) for r in records)


def accuracy(record: Mapping[str, Any]) -> float | None:
    """The record's held-out accuracy, if it has one."""
    for k in HELDOUT_KEYS:
        v = number(record.get(k))
        if v is not None:
            return v
    return None


def monotone_fit(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence nearest `values` in squared error (isotonic regression by
    pooling adjacent violators, equal weights): a run's held-out curve with the noise that
    makes it fall taken out, each value the mean of the block it is pooled into."""
    blocks: list[list[float]] = []  # [sum, count] of each pooled block
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, n = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += n
    return [total / n for total, n in blocks for _ in range(int(n))]


def time_to_target(
    records: Sequence[Mapping[str, Any]],
    target: float,
    eval_in_wall: bool,
    start_acc: float | None = None,
    monotone: bool = False,
) -> Reached | None:
    """The first record (in the order written) whose held-out accuracy is at or above
    `target`; None if none is. `start_acc`: the accuracy before the first step, which at or
    above the target is reached at step 0, at 0 s. With deferred evaluation the accuracies
    are in summary.json, not the records: merge them first (`observe.runs.with_deferred_heldout`).

    `monotone`: compare the run's curve after `monotone_fit` (the start's accuracy first,
    when given, then every evaluated record's) instead of each evaluation as measured, so
    that one evaluation's noise above the target, followed by lower ones, is not a crossing:
    the curve is read as reaching the target where the non-decreasing curve nearest it does."""
    tol = 1e-12
    if start_acc is not None and start_acc >= target - tol:
        return Reached(0, 0.0, 0.0)
    times = training_times(records, eval_in_wall)
    evaluated = [
        (r, t, acc) for r, t in zip(records, times, strict=True) if (acc := accuracy(r)) is not None
    ]
    accs = [acc for _, _, acc in evaluated]
    if monotone:
        head = [] if start_acc is None else [start_acc]
        accs = monotone_fit(head + accs)[len(head) :]
    for (r, t, _), acc in zip(evaluated, accs, strict=True):
        if acc >= target - tol:
            return Reached(int(r["step"]), t, _num(r, "wall_s"))
    return None
