"""The local runtime's lifecycle: every path out leaves no sampler process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import torch
import torch.multiprocessing as mp

from slipstream.runtime.channels import ChannelEnd, Channels, SamplerMessage
from slipstream.runtime.local import ERROR_EXIT, LocalRuntime, default_threads
from slipstream.runtime.processes import WorkersCannotStart


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


class _Proc:
    """A sampler process as `check` and `shutdown` see it, without a process."""

    pid = 0

    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode

    def is_alive(self) -> bool:
        return False

    def join(self, timeout: float | None = None) -> None:
        pass


def test_a_restart_closes_the_dead_sampler_s_inbox():
    """The dead sampler's inbox holds the requests it never read. Left open, its feeder
    thread blocks once they fill the pipe (64 KiB), and Python's exit joins that thread: the
    trainer process hung at exit after the run (a queue holding 200 KB nobody reads, dropped
    unclosed, keeps `python` from exiting). `check` closes it without waiting on the feeder."""
    rt = _runtime(1)
    rt.procs = [_Proc(exitcode=-9)]  # killed
    rt.merged.attach(0, rt.outboxes[0])
    rt._spawn = lambda i: _Proc(exitcode=None)  # type: ignore[method-assign]
    old = rt.inboxes[0]
    assert old.put(["a request"], timeout=1.0)  # its feeder thread runs
    assert rt.check() == [0] and rt.inboxes[0] is not old
    assert old._q._closed and old._q._joincancelled  # multiprocessing.Queue: exit won't join
    rt.shutdown()


def test_a_failing_sampler_waits_for_room_in_its_queue_to_report_the_error():
    """A sampler whose worker raises sends the traceback, then exits with ERROR_EXIT (which
    the runtime does not restart: the message stops the run). Its queue is full while the
    trainer is busy; after one 5 s try the message was dropped, and the run lost its
    sampler without a word (with one sampler: a stall timeout much later)."""
    import threading

    from slipstream.runtime.local import LocalStop, _child_main

    class Full:  # room after 8 tries (the trainer is back to reading)
        def __init__(self) -> None:
            self.tries, self.got = 0, None

        def put(self, msg, timeout):
            self.tries += 1
            if self.tries <= 8:
                return False
            self.got = msg
            return True

    def factory(i):
        raise ValueError("injected failure")

    groups = Full()
    stop = LocalStop(threading.Event())
    ch = Channels(None, groups, None, stop, 1)  # type: ignore[arg-type]
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as e:
            _child_main(factory, 0, ch, torch.get_num_threads())
    finally:
        signal.signal(signal.SIGINT, sigint)
    assert e.value.code == ERROR_EXIT and groups.tries == 9
    assert groups.got is not None and "injected failure" in groups.got.error


class _ExitsOnUnpickle:
    """A factory a fresh sampler cannot even receive: unpickling it exits the process with
    code 1, before its entry function runs (as a sampler does whose main module cannot be
    imported again: a script without `if __name__ == "__main__":`)."""

    def __reduce__(self):
        return (os._exit, (1,))


@pytest.mark.slow  # ~5 s: the fork server imports torch and the library once
def test_samplers_that_exit_before_they_start_stop_the_run_naming_the_main_guard():
    """Before, each was restarted until `RuntimeError: sampler 0 ... was already restarted 3
    times (runtime.max_restarts)`, which did not say why."""
    rt = _runtime(1)
    try:
        rt.start(_ExitsOnUnpickle())  # type: ignore[arg-type]
        end = time.monotonic() + 60
        with pytest.raises(WorkersCannotStart, match=r'3 times in a row.*if __name__ == "__main'):
            while time.monotonic() < end:
                rt.check()
                time.sleep(0.05)
        assert rt.restarts == [2]  # 3 incarnations; the budget (max_restarts) had one more
    finally:
        rt.shutdown()
    _assert_gone(rt)


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
def test_a_sampler_that_reported_an_error_is_not_restarted():
    rt = _runtime(1)
    try:
        rt.start(FailingWorker)
        _ready(rt, 1)
        first = rt.procs[0]
        first.join(30)
        assert first.exitcode == ERROR_EXIT
        for _ in range(3):
            assert rt.check() == []
        assert rt.procs[0] is first and rt.restarts == [0] and not first.is_alive()
        m = rt.channels.groups.get(5.0)
        assert m is not None and m.kind == "error" and "injected failure" in m.error
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


class ListInbox(ChannelEnd):
    def __init__(self, room: int = 100) -> None:
        self.items: list = []
        self.room = room

    def put(self, requests, timeout):
        if len(self.items) >= self.room:
            return False
        self.items.append(requests)
        return True

    def get(self, timeout):
        return self.items.pop(0) if self.items else None

    def depth(self):
        return len(self.items)


def _req(gid: int):
    from slipstream.runtime.channels import PromptRequest
    from slipstream.types import Prompt

    return PromptRequest(gid, Prompt(f"p{gid}", "x", None), (gid,), 1, 0)


def test_router_sends_to_the_least_loaded_live_sampler_and_knows_what_a_dead_one_held():
    from slipstream.runtime.channels import Router

    a, b = ListInbox(), ListInbox(room=1)
    r = Router([a, b])
    assert r.put([_req(0), _req(1)], timeout=0)  # both empty: the first
    assert r.put([_req(2)], timeout=0)  # b holds fewer
    assert r.put([_req(3)], timeout=0)  # b is full: a
    assert r.owner == {0: 0, 1: 0, 2: 1, 3: 0} and r.load == [3, 1]
    r.done(0)
    # sampler 0 dies having started the first two requests sent to it (0 came back already)
    started, queued = r.down(0, started=2)
    assert (started, queued) == ([1], [3])
    assert r.load[0] == 0 and not r.live[0] and 1 not in r.owner and 3 not in r.owner
    r.replace(0, fresh := ListInbox())
    b.items.clear()
    assert r.put([_req(4)], timeout=0) and r.owner[4] == 1  # live before restarting
    r.up(0)
    assert r.put([_req(5)], timeout=0) and r.owner[5] == 0 and fresh.items
    assert not Router([ListInbox(room=0)]).put([_req(6)], timeout=0.01)  # full: False, no hang


def test_the_router_remembers_what_is_in_flight_not_every_group_of_the_run():
    from slipstream.runtime.channels import Router

    inbox = ListInbox(room=10**6)
    r = Router([inbox])
    for gid in range(1000):
        assert r.put([_req(gid)], timeout=0)
        r.done(gid)
    assert len(r.sent[0]) == 0 and r.skipped == [1000]
    for gid in range(1000, 1005):
        r.put([_req(gid)], timeout=0)
    r.done(1001)  # back out of order: 1000 is still held, so nothing is forgotten yet
    assert list(r.sent[0]) == [1000, 1001, 1002, 1003, 1004]
    r.done(1000)
    assert list(r.sent[0]) == [1002, 1003, 1004]
    # it dies having started 1003 requests in all: 1002 (and 1000, 1001, back already)
    assert r.down(0, started=1003) == ([1002], [1003, 1004])


def test_kill_leaves_alone_the_pid_of_a_sampler_already_gone():
    """A sampler's parent is the fork server, which reaps it as it exits: its pid may be
    another process's by the time the trainer kills it (a chaos kill, a silent sampler).
    `kill` sent SIGKILL to the raw pid whatever became of it."""
    other = subprocess.Popen(["sleep", "30"])  # the process now holding the dead one's pid
    rt = _runtime(1)
    try:
        gone = _Proc(exitcode=-9)
        gone.pid = other.pid
        rt.procs = [gone]
        rt.kill(0)
        time.sleep(0.05)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
        rt.shutdown()


def test_kill_ends_a_live_sampler():
    rt = _runtime(1)
    try:
        rt.start(StubbornWorker)
        _ready(rt, 1)
        rt.kill(0)
        rt.procs[0].join(5.0)
        assert rt.procs[0].exitcode == -signal.SIGKILL
    finally:
        rt.shutdown()


def test_a_dead_samplers_last_groups_reach_a_full_queue_before_its_work_is_called_lost():
    """`detach` joined the dead sampler's reader for 0.5 s, but with the trainer's queue full
    the reader could not move its last groups in until the trainer, waiting in `detach`, took
    some: they came after `sampler_lost` and were dropped as late, their work counted lost.
    Now `detach` returns at once and `settling` holds the drain open until the reader is done."""
    from slipstream.runtime.local import MergedGroups

    class Source:
        def __init__(self, msgs):
            self.msgs = list(msgs)

        def get(self, timeout):
            if self.msgs:
                return self.msgs.pop(0)
            time.sleep(timeout)
            return None

    merged = MergedGroups(maxsize=4)
    merged.attach(0, Source([SamplerMessage("stats", 0) for _ in range(4)]))
    deadline = time.monotonic() + 5
    while merged.depth() < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    merged.attach(1, Source([SamplerMessage("group", 1) for _ in range(3)]))
    t0 = time.monotonic()
    merged.detach(1, timeout=5.0)
    assert time.monotonic() - t0 < 1.0 and merged.settling()  # not the 5 s timeout
    got = []
    while (m := merged.get(0)) is not None or merged.settling():  # as Orchestrator.recover
        if m is not None:
            got.append(m)
        time.sleep(0.005)
    assert [m.sampler_id for m in got].count(1) == 3  # the dead one's three groups
    assert not merged.settling()
    merged.close()
