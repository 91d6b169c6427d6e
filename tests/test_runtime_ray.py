"""Real runs on a local Ray (the CI stand-in for a cluster): 2 sampler actors and a trainer
actor; the gloo broadcast weight path; a killed sampler actor restarted by Ray; a stuck actor
is an error, not a hang; and the default task gives the same accuracy on Ray as locally.

One Ray for the module (starting one costs seconds): every core, no dashboard, loopback only,
as `runtime.ray.session` starts it. The runs use `test_orchestrator_local`'s tiny assets.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import ray
import torch

from slipstream.config import load_config
from slipstream.model import load_pretrained
from slipstream.run.launch import train_async
from slipstream.runtime.channels import SamplerMessage
from slipstream.runtime.ray import RayRuntime, RemoteTimeout

sys.path.insert(0, str(Path(__file__).parent))
import test_orchestrator_local as local_tests
from test_orchestrator_local import _cfg, _records
from tiny import warm_cache

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the fakes below
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    """`test_orchestrator_local`'s tiny model and JSONL task."""
    fixture = local_tests.assets
    build = getattr(fixture, "__wrapped__", None) or fixture._get_wrapped_function()
    return build(tmp_path_factory)


def _balanced(ledger: dict) -> bool:
    settled = (
        ledger["trained"]
        + sum(ledger["filtered"].values())
        + ledger["stale"]
        + ledger["aborted"]
        + ledger["lost"]
        + ledger["poisoned"]
        + ledger["unfinished"]
    )
    return ledger["generated"] == settled + ledger["in_flight"] and ledger["balanced"]


RAY = [
    'runtime.kind="ray"',
    'schedule.name="pipeline"',
    "schedule.max_lag=1",
    "runtime.num_samplers=2",
    "runtime.call_timeout_s=30",
]


def test_batched_puts_and_prefetched_gets_keep_every_message_in_order():
    """The channel settings the runtime uses: a writer gathering puts (`coalesce`, `linger_s`)
    and pipelining them (`window`), a reader prefetching `batch` at a time. Every message
    arrives once, in order; a gathered put waits for `push` (or its linger), not longer."""
    from slipstream.runtime.ray_channels import RayQueue

    q = RayQueue.create("t", 8, call_timeout_s=10.0)
    ray.get(q.actor.pid.remote(), timeout=60)  # started: the waits below are the queue's
    writer = RayQueue("t", q.actor, 10.0, window=4)
    writer.coalesce, writer.linger_s = True, 1e9
    reader = RayQueue("t", q.actor, 10.0, batch=5)
    reader.prefetch = True
    try:
        assert writer.put("a", timeout=1.0) and reader.get(0.2) is None  # gathered, not sent
        writer.push(force=False)  # younger than its linger: still held
        assert reader.get(0.2) is None
        writer.linger_s = 0.0
        writer.push(force=False)  # old enough now
        assert reader.get(10.0) == "a"
        got = []
        for i in range(40):  # more than the queue holds: the reader makes room as it goes
            while not writer.put(i, timeout=0.05):
                got.extend(x for x in iter(lambda: reader.get(0.05), None))
            if i % 3 == 0:
                writer.push()
        writer.flush(5.0)
        deadline = time.monotonic() + 10
        while len(got) < 40 and time.monotonic() < deadline:
            got.extend(x for x in iter(lambda: reader.get(0.2), None))
        assert got == list(range(40))
    finally:
        q.close()


def test_two_sampler_actors_and_a_trainer_actor_balance_the_ledger(assets, tmp_path):
    summary = train_async(_cfg(assets, tmp_path / "run", *RAY))
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert _balanced(ledger) and ledger == summary["ledger"] and ledger["trained"] > 0
    records = _records(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["staleness/lag_max"] <= 1 for r in records)
    assert summary["runtime"] == "ray" and summary["weight_transport"] == "object_store"
    pids = summary["sampler_pids"]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    deadline = time.monotonic() + 10  # shut down: the sampler processes are gone
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(p > 0 and not Path(f"/proc/{p}").exists() for p in pids)


def test_weights_by_gloo_broadcast_with_the_trainer_in_the_driver(assets, tmp_path):
    """No fallback to the object store: every publish after version 0 went by broadcast, and
    with lag policy `drop` and K = 1 a run only completes if the samplers keep up with it."""
    cfg = _cfg(
        assets,
        tmp_path / "bc",
        *RAY,
        'runtime.weight_transport="broadcast"',
        "runtime.trainer_actor=false",
    )
    summary = train_async(cfg)
    assert summary["steps"] == 4 and _balanced(summary["ledger"])
    assert summary["weight_transport"] == "broadcast" and summary["weight_fallbacks"] == 0
    assert all(r["staleness/lag_max"] <= 1 for r in _records(tmp_path / "bc"))
    assert not torch.distributed.is_initialized()  # the driver left the group


def test_a_killed_sampler_actor_is_restarted_and_its_work_counted_lost(assets, tmp_path):
    """Ray restarts the killed actor, `check()` calls `run` again in it with a fresh inbox and
    the latest weights; the groups it had started (as of its last report) are lost and issued
    again, the rest of its inbox is sent again as it was. One group at a time per sampler
    (`sampler_slots` = G) keeps each sampler busy with work waiting in its inbox, so the kill
    finds a started group (with a full engine of groups that start and end together, a kill
    right after the last one was delivered would find only requests it has not started)."""
    cfg = _cfg(
        assets,
        tmp_path / "chaos",
        *RAY,
        "run.steps=12",
        "runtime.chaos_kills=1",
        "runtime.chaos_every_s=2",
        "sampling.max_new_tokens=64",
        "runtime.max_restarts=1",
        "runtime.sampler_slots=4",
    )
    summary = train_async(cfg)
    ledger = json.loads((tmp_path / "chaos" / "ledger.json").read_text())
    assert summary["steps"] == 12 and _balanced(ledger), ledger
    assert summary["chaos_kills"] == 1 and summary["sampler_restarts"] == 1
    # its work came back: started groups lost and issued again, the rest re-sent (which of the
    # two depends on where the kill lands: a sampler between two groups has started nothing)
    assert ledger["lost"] + summary["groups_requeued"] >= 1
    assert summary["groups_trained_twice"] == 0


class _Idle:
    """A sampler that holds no model: it waits for the stop flag."""

    def run(self, channels) -> None:
        while not channels.stop.is_set():
            time.sleep(0.05)


def _idle(i: int) -> _Idle:
    return _Idle()


def _stopped(pid: int):
    """SIGSTOP `pid` (a stuck process: alive, answering nothing) until the block ends."""

    class Stopped:
        def __enter__(self):
            os.kill(pid, signal.SIGSTOP)

        def __exit__(self, *exc):
            os.kill(pid, signal.SIGCONT)

    return Stopped()


def test_a_stuck_actor_is_an_error_not_a_hang():
    params = {"w": torch.zeros(3)}
    rt = RayRuntime(params, 1, 1, prompt_queue=2, group_queue=2, call_timeout_s=1.0)
    try:
        rt.channels.weights.publish(params, 0)
        rt.start(_idle)
        deadline = time.monotonic() + 120  # an actor starts in seconds; more on a loaded host
        while not rt.pids()[0]:  # the first ping answered
            rt.check()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        inbox = rt.inboxes[0]
        with _stopped(ray.get(inbox.actor.pid.remote(), timeout=10)):
            t0 = time.monotonic()
            # the sampler's end prefetches: each get looks at its outstanding call, which
            # raises once it is `call_timeout_s` past its long poll
            with pytest.raises(RemoteTimeout, match=r"queue 'inbox 0' \(get\) did not answer"):
                while time.monotonic() - t0 < 10:
                    inbox.get(0.05)
            assert time.monotonic() - t0 < 5
        with _stopped(rt.pids()[0]), pytest.raises(RemoteTimeout, match=r"sampler 0 .* stuck"):
            t0 = time.monotonic()
            while time.monotonic() - t0 < 10:
                rt.check()
                time.sleep(0.05)
    finally:
        rt.shutdown()


class _FailsBehindAFullQueue:
    """Fills the group queue (which nobody reads), then raises."""

    def run(self, channels) -> None:
        channels.groups.put(SamplerMessage("stats", 0), timeout=5)
        channels.groups.push()
        raise ValueError("injected failure")


def _fails(i: int) -> _FailsBehindAFullQueue:
    return _FailsBehindAFullQueue()


def test_a_failing_sampler_actor_s_error_reaches_the_trainer_through_a_full_queue():
    """Its `error` message finds no room (the trainer busy); `check` raises the traceback
    that `run` returned. (It only marked the sampler exited: the error was lost, the
    sampler never restarted, and the run waited on its requests until a stall timeout.)"""
    params = {"w": torch.zeros(3)}
    rt = RayRuntime(params, 1, 1, prompt_queue=2, group_queue=1, call_timeout_s=1.0)
    try:
        rt.channels.weights.publish(params, 0)
        rt.start(_fails)
        deadline = time.monotonic() + 120
        with pytest.raises(RuntimeError, match=r"sampler 0 failed:\n(.|\n)*injected failure"):
            while time.monotonic() < deadline:
                rt.check()
                time.sleep(0.1)
        assert rt.channels.groups.depth() == 1  # the message that filled it, not the error
    finally:
        rt.shutdown()


def test_the_default_task_on_ray_matches_the_local_runtime(tmp_path):
    """The default task and model (`slipstream train`: the built-in task, B = 64, G = 8), a
    few `sync` steps, on both runtimes, each with 2 samplers and the trainer. "Within noise" is exact here: `sync` is deterministic
    with a fixed seed and one thread per process (the local runtime follows the in-process
    loop bit for bit, a test holds that), and Ray only changes where the same code runs. So
    the records, the held-out accuracy and the final weights must be equal. The warm start is
    cut to 8 steps (cached under tmp_path, built once before both runs) to keep CI short: the
    full one takes minutes on a fresh machine, and equality does not need a good model."""
    from slipstream.run.setup import setup

    def cfg(kind: str, name: str = ""):
        return load_config(None, [
            f'run.dir="{tmp_path / (name or kind)}"', "run.steps=3", "run.quiet=true", "run.threads=1",
            "eval.every=3", "eval.num_prompts=32", f'runtime.kind="{kind}"',
            "runtime.num_samplers=2", "runtime.trainer_threads=1", "runtime.threads_per_sampler=1",
            "warmstart.max_steps=8", "warmstart.target_acc=0.99",
            f'warmstart.cache_dir="{warm_cache(tmp_path)}"',
        ])  # fmt: skip

    setup(cfg("local", "warm"))  # both runs start from the cached warm start
    out = {kind: train_async(cfg(kind)) for kind in ("local", "ray")}
    a, b = out["local"], out["ray"]
    assert a["steps"] == b["steps"] == 3
    assert a["heldout_acc_end"] == b["heldout_acc_end"]
    assert a["ledger"] == b["ledger"] and _balanced(b["ledger"])
    timing = ("wall_s", "step_time_s", "time/", "tokens_per_s", "busy", "wait", "engine/",
              "runtime/", "queue/", "goodput", "weights/", "forecast/")  # fmt: skip
    ra, rb = _records(tmp_path / "local"), _records(tmp_path / "ray")
    assert [{k: v for k, v in r.items() if not any(t in k for t in timing)} for r in ra] == [
        {k: v for k, v in r.items() if not any(t in k for t in timing)} for r in rb
    ]
    wa, wb = (
        load_pretrained(tmp_path / k / "checkpoints" / "step_000003" / "model").state_dict()
        for k in ("local", "ray")
    )
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_math_verify_scores_in_the_ray_actors_threads(assets, tmp_path):
    """The actors score in threads, where math-verify's `signal.alarm` timeout raises: with
    it bounded by `call_with_deadline` instead, no sample is an error. (A random model earns
    no math reward: zero-variance groups are kept so that the run has steps.)"""
    extra = ("run.steps=2", 'task.reward="math_verify"', "filters.zero_variance=false")
    cfg = _cfg(assets, tmp_path / "mv", *RAY, *extra)
    summary = train_async(cfg)
    records = _records(tmp_path / "mv")
    assert summary["steps"] == 2 and len(records) == 2
    assert all(r.get("reward/errors_raised", 0) == 0 for r in records), [
        {k: v for k, v in r.items() if "reward" in k} for r in records
    ]


def test_preflight_finds_a_real_ray_head_at_its_gcs_address():
    """`runtime.address` as a user gives it (HOST:PORT of a running head's GCS) passes the
    preflight probe, which calls Ray's own generated GCS service: a change of Ray's internals
    that broke the probe would refuse every cluster, and this test would say so."""
    from slipstream.run.preflight import check_ray_address

    address = ray.get_runtime_context().gcs_address
    check_ray_address(address, timeout_s=10)  # raises ConfigError if not found
