"""`env.worker_concurrency`: one worker process running several episodes' steps at once (a
slow step no longer holds up the others homed there), a timeout's SIGKILL ending the steps
beside it, errors staying with their episode, and the setting's plumbing and validation."""

from __future__ import annotations

import time
from concurrent.futures import Future

import pytest
import torch

from scripted_env import ByMode
from slipstream.config.env import EnvConfig
from slipstream.engine import Engine, SamplingParams
from slipstream.engine.parking import KVPark
from slipstream.envs import StepResult
from slipstream.envs.workers import EnvError, ProcessWorkers, WorkerDied
from slipstream.model.llama import CausalLM, ModelConfig
from slipstream.schedule.episodes import EpisodeRunner, run_episodes
from slipstream.types import Prompt


def _row(key: str, mode: str, sleep_s: float = 0.0) -> Prompt:
    return Prompt(key, "", None, meta={"mode": mode, "sleep_s": sleep_s})


def _pump(workers: ProcessWorkers, futures: list[Future], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not all(f.done() for f in futures) and time.monotonic() < deadline:
        workers.pump(0.05)


def test_worker_concurrency_is_for_worker_processes_only() -> None:
    assert EnvConfig(worker_concurrency=4).worker_concurrency == 4
    with pytest.raises(ValueError, match="worker_concurrency: applies to worker processes"):
        EnvConfig(isolation="thread", worker_concurrency=2)
    with pytest.raises(ValueError):
        EnvConfig(worker_concurrency=0)


@pytest.mark.slow  # ~3 s: a forkserver and one worker
def test_one_worker_runs_its_episodes_steps_at_once() -> None:
    """Four episodes homed in one worker process (concurrency 4), each step sleeping 0.5 s:
    the four second steps overlap (one after another they take 2 s), all in one process,
    and the worker never runs more than four at once (a fifth waits in the queue)."""
    workers = ProcessWorkers(ByMode, 1, concurrency=4)
    keys = [f"e{i}" for i in range(5)]
    try:
        firsts = [workers.first(k, _row(k, "slow", 0.5)) for k in keys]
        _pump(workers, firsts, 30)
        assert all(f.exception() is None for f in firsts)
        steps = [workers.step(k, [5]) for k in keys[:4]]
        _pump(workers, steps, 10)  # the first steps: observations
        t0 = time.monotonic()
        steps = [workers.step(k, [5]) for k in keys]
        w = workers.workers[0]
        assert len(w.running) == 4 and [op.key for op in w.queue] == ["e4"]
        assert all(workers.started(k) is not None for k in keys[:4])
        assert workers.started("e4") is None  # queued: its clock has not started
        _pump(workers, steps[:4], 10)
        wall = time.monotonic() - t0
        outs = [f.result()[0] for f in steps[:4]]
        assert all(isinstance(o, StepResult) and o.done and o.reward == 1.0 for o in outs)
        assert len({o.metrics["pid"] for o in outs if isinstance(o, StepResult)}) == 1
        assert all(f.result()[1] >= 0.5 for f in steps[:4])  # each step's own seconds
        assert wall < 1.5, wall  # one after another: 2 s
        assert workers.deaths == 0
    finally:
        workers.close()


@pytest.mark.slow  # ~3 s: a forkserver and two workers over the test
def test_a_timeout_ends_the_steps_running_beside_it_and_errors_stay_with_their_episode() -> None:
    workers = ProcessWorkers(ByMode, 1, concurrency=3)
    rows = {"hang": _row("hang", "hang"), "slow": _row("slow", "slow", 2.0),
            "raise": _row("raise", "raise")}  # fmt: skip
    try:
        firsts = [workers.first(k, r) for k, r in rows.items()]
        _pump(workers, firsts, 30)
        hang, slow, bad = (workers.step(k, [5]) for k in rows)
        _pump(workers, [bad], 10)
        err = bad.exception()  # the raising step fails its own episode only
        assert isinstance(err, EnvError) and "RuntimeError: tool crashed" in str(err)
        assert not hang.done() and not slow.done()
        workers.abandon("hang")  # as the runner does at env.step_timeout_s
        assert isinstance(slow.exception(timeout=0), WorkerDied)
        assert "another episode's step timed out" in str(slow.exception())
        assert workers.deaths == 1
        again = workers.step("slow", [5])  # its environment went with the worker
        assert isinstance(again.exception(timeout=0), WorkerDied)
        workers.end("slow")
        workers.end("raise")
        ok = workers.first("ok", _row("ok", "ok"))  # the fresh worker takes new episodes
        _pump(workers, [ok], 30)
        s1 = workers.step("ok", [5])
        _pump(workers, [s1], 10)
        s2 = workers.step("ok", [5])
        _pump(workers, [s2], 10)
        out = s2.result()[0]
        assert isinstance(out, StepResult) and out.done and out.reward == 1.0
    finally:
        workers.close()


@pytest.mark.slow  # ~3 s: a forkserver and one worker, through the episode runner
def test_the_episode_runner_builds_concurrent_workers_from_its_config() -> None:
    """`env.worker_concurrency` reaches the workers the runner makes: eight episodes in one
    worker process, steps of 0.4 s overlapping (one after another: 6.4 s)."""
    cfg = EnvConfig(workers=1, worker_concurrency=8, step_timeout_s=5.0)
    mcfg = ModelConfig(
        vocab_size=13, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    engine = Engine(CausalLM(mcfg).eval(), 1, num_slots=8, max_len=64)
    engine.park = KVPark(1000)
    runner = EpisodeRunner(ByMode, SamplingParams(0.0, 1.0, 0, 2), cfg, 64)
    try:
        assert isinstance(runner.workers, ProcessWorkers) and runner.workers.concurrency == 8
        run_episodes(engine, runner, [(_row("warm", "ok"), "warm", 0)])  # the worker starts
        items = [(_row(f"e{i}", "slow", 0.4), f"e{i}", i) for i in range(8)]
        t0 = time.monotonic()
        eps = run_episodes(engine, runner, items)
        wall = time.monotonic() - t0
    finally:
        runner.close()
    assert sorted(e.key for e in eps) == [f"e{i}" for i in range(8)]
    assert all(e.stats.end in ("done", "max_tokens") for e in eps)
    assert sum(e.stats.env_time_s for e in eps) >= 8 * 2 * 0.4
    assert wall < 8 * 2 * 0.4 / 2, wall


@pytest.mark.slow  # ~2 s: a forkserver and one worker
def test_an_episode_ended_while_its_step_runs_is_dropped_after_the_step_answers() -> None:
    """`EpisodeRunner.cancel` ends episodes whose step is running: the drop waits for the
    step's answer (a drop sent at once could reach the worker's pool while the step still
    waits there, and a step cancelled there would never answer: its place held for ever)."""
    workers = ProcessWorkers(ByMode, 1, concurrency=2)
    try:
        firsts = [workers.first(k, _row(k, "slow", 0.5)) for k in ("a", "b")]
        _pump(workers, firsts, 30)
        running = workers.step("a", [5])
        workers.end("a")  # while its step sleeps in the worker
        w = workers.workers[0]
        assert "a" in w.running and w.drops == ["a"]  # held back
        _pump(workers, [running], 10)
        assert running.exception() is None  # answered; nobody waits for it now
        assert not w.running and w.drops == []  # the drop went once the step answered
        second = workers.step("b", [5])
        _pump(workers, [second], 10)
        assert second.exception() is None and workers.deaths == 0
    finally:
        workers.close()
