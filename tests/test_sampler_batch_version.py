"""A fixed batch is generated at the weights published before it, even when its prompts
arrive first. On the Ray runtime the trainer's weight `offer` and the prompt chunk travel as
separate calls, so a sampler can hold the chunk of batch v while its weight channel still
shows v - 1; it used to generate the batch at v - 1, and under `sync` (K = 0) the whole
batch was then dropped as stale (seen on a loaded machine: 32 of 576 samples stale in
tests/test_runtime_ray.py's sync run, where the local runtime had none)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from slipstream.engine.stats import EngineStats
from slipstream.runtime.channels import PromptRequest, SamplerReport
from slipstream.schedule.sampler import SamplerState, SamplerWorker
from slipstream.types import Prompt


class LateWeights:
    """A weight channel at v0 whose v1 lands `delay_s` after the test starts."""

    def __init__(self, delay_s: float | None) -> None:
        self.v = 0
        if delay_s is not None:
            threading.Timer(delay_s, self.land).start()

    def land(self) -> None:
        self.v = 1

    def version(self) -> int:
        return self.v

    def read(self, newer_than: int, timeout: float):
        return ({}, self.v) if self.v > newer_than else None


class FakeEngine:
    def __init__(self) -> None:
        self.version, self.num_active, self.stats, self.refill = 0, 0, EngineStats(), None

    def load_weights(self, state, version: int) -> None:
        self.version = version

    def step(self) -> list:
        return []

    def idle(self) -> bool:
        return self.num_active == 0


def _worker(timeout_s: float = 5.0) -> tuple[SamplerWorker, list[int]]:
    w = SamplerWorker.__new__(SamplerWorker)  # the batch-taking half: fakes for the rest
    w.id, w.poll_s, w.state, w.runner = 0, 0.01, SamplerState(), None
    w.state.report = SamplerReport(0, 0.0, 0.0)
    w.engine = FakeEngine()  # type: ignore[assignment]
    w.spec = SimpleNamespace(  # type: ignore[assignment]
        schedule=SimpleNamespace(batching="fixed", weight_sync="between_batches"),
        cfg=SimpleNamespace(runtime=SimpleNamespace(startup_timeout_s=timeout_s)),
    )
    admitted_at: list[int] = []
    w._admit = lambda chunk: admitted_at.append(w.engine.version)  # type: ignore[method-assign]
    return w, admitted_at


def _channels(weights: LateWeights) -> SimpleNamespace:
    chunk = [PromptRequest(3, Prompt("p3", "1+2=", "3"), (30, 31), 2, issue_version=1, batch=1)]
    return SimpleNamespace(
        prompts=SimpleNamespace(get=lambda timeout: chunk),
        weights=weights,
        stop=threading.Event(),
    )


def test_a_batch_whose_prompts_arrive_before_its_weights_waits_for_them():
    w, admitted_at = _worker()
    w._take(_channels(LateWeights(delay_s=0.1)))
    assert admitted_at == [1]  # generated at v1, the version it was issued at
    assert w.state.report.weight_loads == 1


def test_weights_already_there_are_loaded_without_waiting():
    w, admitted_at = _worker()
    weights = LateWeights(delay_s=None)
    weights.land()
    w._take(_channels(weights))
    assert admitted_at == [1]


def test_weights_that_never_arrive_end_the_sampler_with_a_named_error():
    w, admitted_at = _worker(timeout_s=0.05)
    with pytest.raises(TimeoutError, match="weights v1, published before its batch"):
        w._take(_channels(LateWeights(delay_s=None)))
    assert admitted_at == []
