"""Schedule defects a review found, each pinned by a test that failed before its fix.

- `min_lag` with dynamic sampling: a window's refills were the next groups to arrive, all
  too young for it, so the window never closed and, nothing being in flight, nothing timed
  out: the run hung in silence.
- a window that can never complete (nothing in flight, admission full) raised nothing.
- an idle fixed-batch sampler blocked in `_wait_for_work` generated its batch at the weights
  it held, not at the version the batch was issued at (stale under `sync`, dropped whole).
- a sample without model tokens (an episode ended before its first turn) counted as version
  0, so its group's lag was the trainer's version: dropped as stale.
- a retried request had no `min_lag` issue window: it counted as issued at window 0.
- the run's `lag_mean` weighed each step by every generated token, filtered groups and
  environment tokens included, where a step's own mean is over the trained model tokens.
- a sampler whose episodes all waited on environments sent nothing: killed as hung.

Uses `test_orchestrator`'s and `test_sampler_batch_version`'s fakes.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from slipstream.runtime.channels import Channels, SamplerMessage, SamplerReport
from slipstream.schedule import sampler as sampler_mod
from slipstream.schedule.episodes import Episode
from slipstream.schedule.orchestrator import Options, Orchestrator
from slipstream.schedule.presets import preset
from slipstream.schedule.step_stats import StepStats, group_lag
from slipstream.types import FinishReason, Group, Prompt, Sample
from test_orchestrator import B, FakeLearner, FakePrompts, FakeSampler, FakeWeights, _bare
from test_sampler_batch_version import LateWeights, _channels, _worker


def _deadline(seconds: float):
    """A `health` hook that ends a run still going after `seconds` (a hang fails the test)."""
    end = time.monotonic() + seconds

    def health() -> None:
        if time.monotonic() > end:
            raise AssertionError(f"the run hung: still going after {seconds} s")

    return health


class _LagLearner(FakeLearner):
    """Records each step's (version, prompt ids, lag of each group)."""

    def train(self, groups: list[Group]) -> dict:
        lags = tuple(self.version - min(s.versions_T[0] for s in g.samples) for g in groups)
        self.events.append(("lags", self.version, tuple(g.prompt.id for g in groups), lags))
        return super().train(groups)


def _min_lag_orchestrator(sampler_cls=FakeSampler, filtered=frozenset(), **opts):
    events: list[tuple] = []
    learner = _LagLearner(events, filtered)
    weights = FakeWeights(events)
    prompts = FakePrompts(events, weights)
    sampler = sampler_cls(prompts, weights, in_flight=False)
    ch = Channels(prompts, sampler, weights, stop=None, num_samplers=1)  # type: ignore[arg-type]
    o = Options(B, 2, 8, poll_s=0.001, min_lag=2, **{"stall_timeout_s": 5.0, **opts})
    orch = Orchestrator(preset("pipeline", 2), o, learner, ch, health=_deadline(1.5))
    return events, orch, learner


# ---- 1. min_lag with dynamic sampling ---------------------------------------------------------
def test_min_lag_with_dynamic_sampling_refills_a_window_and_runs_to_the_end():
    """p9 of window 2 is filtered: its refill is issued for window 2 and taken there, and
    the windows after it still train the groups issued exactly 2 windows before."""
    events, orch, learner = _min_lag_orchestrator(filtered=frozenset({9}), dynamic_sampling=True)
    orch.start()
    orch.run()
    steps = [e for e in events if e[0] == "lags"]
    assert learner.version == 8 and len(steps) == 8
    v2 = steps[2]
    assert v2[2] == ("p8", "p10", "p11", "p20") and v2[3] == (2, 2, 2, 0)  # p20: the refill
    assert all(lags == (2,) * B for *_, lags in steps[3:])
    led = learner.ledger
    assert led.filtered["fake"] == 1 and led.stale == 0


class _AbortingSampler(FakeSampler):
    """Sends p9's group back aborted (as lag policy `abort` does)."""

    def get(self, timeout):
        msg = super().get(timeout)
        if msg is not None and msg.request.prompt.id == "p9":
            msg.kind = "aborted"
        return msg


def test_a_window_that_can_never_complete_raises_a_named_error():
    """min_lag = K: window 2 can take only the groups issued at window 0, and one of them was
    aborted. Nothing is in flight and admission is full: no group can ever come. The run
    raises once the stall timeout passes (it waited for ever: the stall check looked only
    at requests in flight)."""
    _, orch, learner = _min_lag_orchestrator(_AbortingSampler, stall_timeout_s=0.2)
    orch.start()
    with pytest.raises(RuntimeError, match="no window can complete and nothing is in flight"):
        orch.run()
    assert learner.version == 2 and not orch.state.outstanding


# ---- 2. a fixed batch taken by an idle sampler waits for its weights --------------------------
class _Groups:
    def push(self, force: bool = True) -> None:
        pass


def test_an_idle_fixed_sampler_generates_its_next_batch_at_the_batchs_version():
    """The chunk of batch 1 (issued at v1) reaches a sampler blocked in `_wait_for_work`
    before v1 does (Ray: the weights' offer and the prompts are separate calls)."""
    w, admitted_at = _worker()
    ch = _channels(LateWeights(delay_s=0.1))
    ch.groups = _Groups()
    w._wait_for_work(ch)  # type: ignore[arg-type]
    assert admitted_at == [1]  # it was [0]: the whole batch then dropped as stale under sync
    assert w.state.report.weight_loads == 1


# ---- 3. samples without model tokens ------------------------------------------------------------
def _failed_episode_sample(prompt: Prompt) -> Sample:
    """An episode whose environment failed before the model's first turn (no model token)."""
    ep = Episode(("g", 3), prompt, seed=3, prompt_tokens=[1])
    ep.error = "env factory raised"
    ep.stats.end = "error"
    return ep.sample()


def test_a_sample_without_model_tokens_does_not_age_its_group():
    _, orch, learner = _bare("async", max_lag=2)
    learner.version = 5
    prompt = Prompt("p0", "x", None)
    req = orch._request(prompt, 4, batch=-1)
    ok = [
        Sample("p0", [1], [2, 2], [0.0] * 2, [5, 4], FinishReason.STOP, reward=float(i % 2))
        for i in range(3)
    ]
    group = Group(prompt, [*ok, _failed_episode_sample(prompt)])
    assert group.samples[-1].oldest_version is None and group.oldest_version == 4
    assert group.lag(5) == 1
    orch.receive(SamplerMessage("group", 0, request=req, group=group))
    assert learner.ledger.stale == 0 and len(orch.state.window) == 1


def test_a_group_with_no_model_token_at_all_has_lag_zero():
    prompt = Prompt("p0", "x", None)
    group = Group(prompt, [_failed_episode_sample(prompt) for _ in range(2)])
    assert group.oldest_version is None and group.lag(7) == 0


# ---- 4. a retried request keeps its min_lag window ---------------------------------------------
def _deliver(orch: Orchestrator, gid: int, version: int) -> None:
    req = orch.state.outstanding[gid]
    samples = [
        Sample(req.prompt.id, [1], [2], [0.0], [version], FinishReason.STOP, reward=float(g % 2))
        for g in range(req.group_size)
    ]
    orch.receive(SamplerMessage("group", 0, request=req, group=Group(req.prompt, samples)))
    orch._close_ready_windows()


def test_a_retried_request_is_held_back_as_its_lost_request_was():
    """min_lag = 2: requests 12..15 are issued at window 1, for window 3. The sampler dies at
    window 1 having started requests 4..12; the retry of 12 (request 24) comes back before the
    retry of 7, which window 1 waits for. Window 1 must not take it (it did: with no issue
    window recorded, the retry counted as issued at window 0)."""
    _, orch, learner = _bare("pipeline", max_lag=2, min_lag=2)
    orch.start()  # requests 0..11, issued at window 0
    for gid in range(B):
        _deliver(orch, gid, version=0)
    assert learner.version == 1 and orch.state.issue_window[12] == 1
    orch.stats.reports[0] = SamplerReport(0, time.perf_counter(), 0.0, started=13)
    orch.sampler_lost(0)  # 4..12 lost: retried as 16..24, in order
    assert orch.state.issue_window.get(24) == 1 and orch.state.issue_window[16] == 0
    for gid in (16, 17, 18, 24):  # the retries of 4, 5, 6 and 12
        _deliver(orch, gid, version=1)
    assert learner.version == 1  # window 1 still waits for the retry of 7
    _deliver(orch, 19, version=1)
    assert learner.version == 2 and 24 in orch.state.issue_window


# ---- 5. the run's lag_mean -----------------------------------------------------------------------
def _group(pid: str, n: int, version: int, rewards=(0.0, 1.0)) -> Group:
    samples = [
        Sample(pid, [1], [2] * n, [0.0] * n, [version] * n, FinishReason.STOP, reward=r)
        for r in rewards
    ]
    return Group(Prompt(pid, "x", None), samples)


def test_the_runs_lag_mean_is_weighted_by_trained_model_tokens():
    """Step 1 trains 2 tokens at lag 0 beside 600 filtered ones; step 2 trains 20 at lag 2.
    Over the trained tokens the mean is 40 / 22 (weighted by generated tokens it was 0.06)."""
    st = StepStats()
    st.start()
    kept1 = [_group("a", 1, 2)]
    filtered = [_group(f"f{i}", 100, 2, (1.0, 1.0)) for i in range(3)]
    st.record(kept1 + filtered, kept1, {}, group_lag(kept1, 2, 4), 0.1, 0.0)
    kept2 = [_group("b", 10, 1)]
    st.record(kept2, kept2, {}, group_lag(kept2, 3, 4), 0.1, 0.0)
    assert st.summary()["lag_mean"] == pytest.approx(40 / 22)


# ---- 6. a sampler waiting on environments reports ------------------------------------------------
class _WaitingRunner:
    """Four episodes, each waiting on a slow environment step."""

    in_flight = 4

    def wait(self, timeout: float) -> None:
        time.sleep(timeout)

    def poll(self) -> tuple[list, list]:
        return [], []


class _Sent:
    def __init__(self) -> None:
        self.kinds: list[str] = []

    def put(self, msg: SamplerMessage, timeout: float) -> bool:
        self.kinds.append(msg.kind)
        return True

    def push(self, force: bool = True) -> None:
        pass


def test_a_sampler_waiting_only_on_environments_still_reports(monkeypatch):
    """Its stats keep the orchestrator's silence check (`sampler_timeout_s`) from killing it
    as hung; it sent nothing while its episodes waited."""
    monkeypatch.setattr(sampler_mod, "STATS_EVERY_S", 0.05)
    w, _ = _worker()
    w.spec.schedule.batching = "continuous"
    w.spec.schedule.max_lag = 4
    w.lag_policy, w.log = "drop", None
    w.state.report.busy_s = 1.0  # it has generated: its episodes' first turns ran
    w.runner = _WaitingRunner()  # type: ignore[assignment]
    w.engine.num_slots = 8  # type: ignore[attr-defined]
    sent, stop = _Sent(), threading.Event()
    ch = SimpleNamespace(
        prompts=SimpleNamespace(get=lambda timeout: None),
        groups=sent,
        weights=LateWeights(None),
        stop=stop,
    )
    threading.Timer(0.4, stop.set).start()
    w._loop(ch)  # type: ignore[arg-type]
    assert sent.kinds.count("stats") >= 3
