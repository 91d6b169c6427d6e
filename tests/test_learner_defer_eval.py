"""Deferred evaluation (`runtime.defer_eval`): each evaluation step's weights are scored after
the run, as they were at that step, and the run holds none of them in memory meanwhile."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import torch

from slipstream.run.learner import RunLearner
from slipstream.schedule.ledger import Ledger


def _tensors(x: object) -> int:
    if isinstance(x, torch.Tensor):
        return 1
    if isinstance(x, dict):
        return sum(_tensors(v) for v in x.values())
    if isinstance(x, list | tuple):
        return sum(_tensors(v) for v in x)
    return 0


def test_deferred_evaluations_score_each_steps_weights_and_hold_none(tmp_path):
    model = torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    versions: list[int | None] = []  # the version each evaluation scored as (trainer_state)

    def evaluate(version: int | None = None) -> float:
        versions.append(version)
        return float(model.weight.detach().sum())  # "accuracy": a function of the weights

    engine = SimpleNamespace(version=7)
    run = SimpleNamespace(
        model=model,
        eval_engine=engine,
        evaluate=evaluate,
        ledger=Ledger(),
        counters=Counter(),
        dir=tmp_path,
    )
    learner = RunLearner(run, defer_eval=True)  # type: ignore[arg-type]
    for step in (1, 2, 3):
        with torch.no_grad():
            model.weight.add_(1.0)  # after step s the weights sum to 3 s
        assert learner.evaluate(step) is None
    assert _tensors(vars(learner)) == 0  # not a copy per evaluation step in memory
    with torch.no_grad():
        model.weight.fill_(-1.0)  # the final weights
    learner.evaluate_deferred()
    assert [(c["step"], c["heldout_acc"]) for c in learner.curve] == [(1, 3.0), (2, 6.0), (3, 9.0)]
    assert torch.equal(model.weight, torch.full((1, 3), -1.0))  # back to the final weights
    # each snapshot scored as its step's version, told to `evaluate`: the engine is not changed
    assert versions == [1, 2, 3] and engine.version == 7
    learner.drop_snapshots()  # once the summary is written
    assert not (tmp_path / "eval_snapshots").exists()


def _summing_learner(model: torch.nn.Linear, folder: Path) -> RunLearner:
    """A deferring learner of a stand-in run whose accuracy is the sum of `model`'s weights."""
    run = SimpleNamespace(
        model=model,
        eval_engine=SimpleNamespace(version=0),
        evaluate=lambda version=None: float(model.weight.detach().sum()),
        ledger=Ledger(),
        counters=Counter(),
        dir=folder,
    )
    return RunLearner(run, defer_eval=True)  # type: ignore[arg-type]


def test_a_resumed_learner_keeps_the_curve_and_the_snapshots_up_to_its_checkpoint(tmp_path):
    """A checkpoint at step 2 holds the snapshots of steps 0 and 2 (not scored yet): resumed
    from it, they are scored with the resumed run's, and the snapshot of step 4 that the run
    before the resume took (past the checkpoint) is gone. Before, the resumed run's curve began
    at its first evaluation after the resume, which became its start accuracy."""
    model = torch.nn.Linear(3, 1, bias=False)

    def make() -> RunLearner:
        return _summing_learner(model, tmp_path)

    first = make()
    for step in (0, 2):
        with torch.no_grad():
            model.weight.fill_(step)
        first.evaluate(step)
    saved = first.state_dict()  # the checkpoint of step 2 (JSON)
    with torch.no_grad():
        model.weight.fill_(4.0)
    first.evaluate(4)  # after the checkpoint; then the run is killed
    resumed = make()
    resumed.restored(saved, 2)
    assert sorted(p.name for p in (tmp_path / "eval_snapshots").iterdir()) == [
        "step_000000.pt",
        "step_000002.pt",
    ]
    with torch.no_grad():
        model.weight.fill_(5.0)
    resumed.evaluate(4)  # the resumed run's own step 4
    resumed.evaluate_deferred()
    assert [(c["step"], c["heldout_acc"]) for c in resumed.curve] == [
        (0, 0.0),
        (2, 6.0),
        (4, 15.0),
    ]


def test_snapshots_written_on_a_gpu_are_scored_where_that_gpu_is_not(tmp_path, monkeypatch):
    """A snapshot holds the trainer's tensors on its GPU (`cuda:1` of the run that wrote it);
    a run resumed with another placement (one GPU visible, or none) scored it with a plain
    `torch.load`, which refuses a device the process does not see. The write on `cuda:1` is
    made here by tagging the CPU tensors' storages as `torch.save` tags a GPU's."""
    import torch.serialization

    model = torch.nn.Linear(3, 1, bias=False)
    learner = _summing_learner(model, tmp_path)
    with torch.no_grad():
        model.weight.fill_(2.0)
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:1")
        learner.evaluate(1)
    learner.evaluate_deferred()
    assert [(c["step"], c["heldout_acc"]) for c in learner.curve] == [(1, 6.0)]
