"""Lag policy `abort` reaches episodes that wait on an environment: a sampler whose engine is
idle, with only an environment step in flight, still cuts a group the newest weights made
stale, instead of waiting for the slow step to end first. (The end-to-end run of the policy
with episodes is tests/test_envs_train.py::test_stale_groups_abort_their_episodes_under_the_
abort_lag_policy.)"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from slipstream.engine.stats import EngineStats
from slipstream.runtime.channels import PromptRequest, SamplerMessage, SamplerReport
from slipstream.schedule.sampler import SamplerState, SamplerWorker, _Member
from slipstream.types import Prompt


class _Episode:
    def __init__(self, key: tuple[int, int], version: int) -> None:
        self.key, self.version, self.tokens = key, version, [5, 6, 7]

    def oldest(self, version: int) -> bool:
        return self.version <= version


class OneEpisodeInAStep:
    """An episode runner holding one episode (tokens of version 0) inside an environment
    step that never ends on its own; the loop's first wait for it sets the stop flag."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.episodes = {(7, 0): _Episode((7, 0), 0)}
        self.waits = 0

    @property
    def in_flight(self) -> int:
        return len(self.episodes)

    def poll(self) -> tuple[list, list]:
        return [], []

    def wait(self, timeout: float) -> None:
        self.waits += 1
        self.stop.set()

    def cancel(self, pred) -> list[_Episode]:
        out = [e for k, e in self.episodes.items() if pred(k)]
        self.episodes = {k: e for k, e in self.episodes.items() if not pred(k)}
        return out

    def close(self) -> None:
        pass


class Collect:
    def __init__(self) -> None:
        self.got: list[SamplerMessage] = []

    def put(self, msg: SamplerMessage, timeout: float) -> bool:
        self.got.append(msg)
        return True

    def push(self, force: bool) -> None:
        pass


def _worker(latest: int, max_lag: int) -> tuple[SamplerWorker, SimpleNamespace]:
    stop = threading.Event()
    w = SamplerWorker.__new__(SamplerWorker)  # the loop with fakes: no model, no engine
    w.id, w.poll_s, w.lag_policy, w.state = 0, 0.01, "abort", SamplerState()
    now = time.perf_counter()  # it just reported: no heartbeat is due (`_report_due`)
    w.state.report = SamplerReport(0, now, now)
    w.state.t_last_report = now
    w.spec = SimpleNamespace(schedule=SimpleNamespace(max_lag=max_lag))  # type: ignore[assignment]
    w.engine = SimpleNamespace(  # type: ignore[assignment]
        stats=EngineStats(),
        num_active=0,
        idle=lambda: True,
        abort=lambda pred: [],
        cancel_waiting=lambda pred: [],
    )
    w.runner = OneEpisodeInAStep(stop)  # type: ignore[assignment]
    w._sync_weights = lambda ch: None  # type: ignore[method-assign]
    w._take = lambda ch: None  # type: ignore[method-assign]
    request = PromptRequest(7, Prompt("p7", "1+2=", 3), (70, 71), 2, issue_version=0)
    w.state.groups[7] = _Member(request)
    ch = SimpleNamespace(
        stop=stop, groups=Collect(), weights=SimpleNamespace(version=lambda: latest)
    )
    return w, ch


def test_an_idle_engine_still_cuts_a_group_waiting_on_an_environment_once_it_is_stale():
    w, ch = _worker(latest=2, max_lag=1)  # the episode's version-0 tokens are 2 behind
    w._loop(ch)  # type: ignore[arg-type]
    assert w.runner.waits == 1
    assert [m.kind for m in ch.groups.got] == ["aborted"]
    assert ch.groups.got[0].request.group_id == 7 and not w.state.groups
    assert not w.runner.episodes and w.state.report.aborted_tokens == 3


def test_a_group_within_the_bound_is_left_to_its_environment():
    w, ch = _worker(latest=1, max_lag=1)  # one behind: within K = 1
    w._loop(ch)  # type: ignore[arg-type]
    assert w.runner.waits == 1 and not ch.groups.got
    assert 7 in w.state.groups and w.runner.episodes
