"""The local runtime's lifecycle: every path out leaves no sampler process behind."""

from __future__ import annotations

import signal
import time

import pytest
import torch
import torch.multiprocessing as mp

from slipstream.runtime.channels import Channels, SamplerMessage
from slipstream.runtime.local import LocalRuntime, default_threads


class EchoWorker:
    """Answers each prompt chunk with a stats message until stopped."""

    def __init__(self, sampler_id: int) -> None:
        self.id = sampler_id

    def run(self, ch: Channels) -> None:
        ch.groups.put(SamplerMessage("ready", self.id), timeout=5)
        while not ch.stop.is_set():
            if ch.prompts.get(0.05) is not None:
                ch.groups.put(SamplerMessage("stats", self.id), timeout=5)


class FailingWorker(EchoWorker):
    def run(self, ch: Channels) -> None:
        ch.groups.put(SamplerMessage("ready", self.id), timeout=5)
        raise ValueError("injected failure")


class StubbornWorker(EchoWorker):
    """Ignores the stop flag and SIGTERM: only kill() ends it."""

    def run(self, ch: Channels) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        ch.groups.put(SamplerMessage("ready", self.id), timeout=5)
        while True:
            time.sleep(0.05)


def _runtime(n: int = 2, shutdown_s: float = 5.0) -> LocalRuntime:
    return LocalRuntime(
        {"w": torch.zeros(4)}, n, 1, prompt_queue=8, group_queue=8, shutdown_timeout_s=shutdown_s
    )


def _ready(rt: LocalRuntime, n: int) -> list[SamplerMessage]:
    got = []
    end = time.monotonic() + 60
    while len([m for m in got if m.kind == "ready"]) < n and time.monotonic() < end:
        m = rt.channels.groups.get(0.1)
        if m is not None:
            got.append(m)
    return got


def _assert_gone(rt: LocalRuntime) -> None:
    assert rt.procs and all(not p.is_alive() for p in rt.procs)
    assert not [p for p in mp.active_children() if p.name.startswith("slipstream-sampler")]


def test_default_threads_split_the_cores():
    assert default_threads(1, cores=2) == 1
    assert default_threads(1, cores=8) == 4
    assert default_threads(3, cores=2) == 1


@pytest.mark.slow
def test_normal_run_and_shutdown_leave_no_process():
    with _runtime(2) as rt:
        rt.start(EchoWorker)
        assert len(_ready(rt, 2)) == 2
        for _ in range(4):
            assert rt.channels.prompts.put([], timeout=1)
        answers = [rt.channels.groups.get(5.0) for _ in range(4)]
        assert all(a is not None and a.kind == "stats" for a in answers)
        rt.check()
    _assert_gone(rt)
    assert all(p.exitcode == 0 for p in rt.procs)  # they stopped by themselves


@pytest.mark.slow
def test_a_failing_sampler_surfaces_its_error_and_leaves_no_process():
    rt = _runtime(1)
    try:
        rt.start(FailingWorker)
        _ready(rt, 1)
        end = time.monotonic() + 30
        with pytest.raises(RuntimeError, match="injected failure"):
            while time.monotonic() < end:
                m = rt.channels.groups.get(0.1)
                if m is not None and m.kind == "error":
                    raise RuntimeError(m.error)
                rt.check()
    finally:
        rt.shutdown()
    _assert_gone(rt)


@pytest.mark.slow
def test_shutdown_kills_a_sampler_that_ignores_stop():
    rt = _runtime(1, shutdown_s=0.5)
    rt.start(StubbornWorker)
    _ready(rt, 1)
    t0 = time.monotonic()
    rt.shutdown()
    assert time.monotonic() - t0 < 10
    _assert_gone(rt)
    assert rt.procs[0].exitcode == -signal.SIGKILL
