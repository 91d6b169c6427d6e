"""A sampler that dies on one prompt every time (a deterministic crash): the request is issued
again `max_request_retries` times, then dropped as `poisoned`, and the run goes on. A request
a sampler started and that is not back when the run ends is `unfinished`, with its tokens.
Uses `test_orchestrator`'s fakes plus a fake runtime that restarts the fake sampler."""

from __future__ import annotations

import time
from collections import deque

import pytest

from slipstream.runtime.channels import (
    ChannelEnd,
    Channels,
    PromptRequest,
    Router,
    SamplerMessage,
    SamplerReport,
)
from slipstream.schedule.orchestrator import Options, Orchestrator
from slipstream.schedule.presets import preset
from slipstream.types import FinishReason, Group, Sample
from test_orchestrator import B, FakeLearner, FakePrompts, FakeSampler, FakeWeights, G


class PoisonSampler(FakeSampler):
    """Dies each time it starts a request for prompt `poison`, having reported it started."""

    def __init__(self, prompts: FakePrompts, weights: FakeWeights, poison: str) -> None:
        super().__init__(prompts, weights, in_flight=False)
        self.poison, self.started, self.dead = poison, 0, False
        self.t_ready: float | None = None

    def get(self, timeout):
        if self.dead:
            return None
        msg = super().get(timeout)
        if msg is None:
            return None
        if self.t_ready is None:  # a fresh incarnation: ready once it has work again
            self.t_ready = time.perf_counter()
        self.started += 1
        report = SamplerReport(0, time.perf_counter(), self.t_ready, started=self.started)
        if msg.request.prompt.id == self.poison:
            self.dead = True
            return SamplerMessage("stats", 0, report=report)
        msg.report = report
        return msg


class FakeRuntime:
    """Restarts the dead sampler with a fresh inbox, at most `max_restarts` times."""

    def __init__(self, sampler: PoisonSampler, max_restarts: int = 10) -> None:
        self.sampler, self.max_restarts, self.restarts = sampler, max_restarts, 0

    def check(self) -> list[int]:
        s = self.sampler
        if not s.dead:
            return []
        if self.restarts == self.max_restarts:
            raise RuntimeError("sampler 0 died too often: restart budget spent")
        self.restarts += 1
        s.dead, s.started, s.t_ready = False, 0, None
        s.chunk.clear()
        s.prompts.q.clear()
        return [0]


@pytest.mark.parametrize("name", ["sync", "pipeline"])
def test_a_request_that_kills_every_sampler_is_dropped_after_its_retries(name):
    events: list[tuple] = []
    learner, weights = FakeLearner(events), FakeWeights(events)
    prompts = FakePrompts(events, weights)
    sampler = PoisonSampler(prompts, weights, poison="p1")
    runtime = FakeRuntime(sampler)
    ch = Channels(prompts, sampler, weights, stop=None, num_samplers=1)  # type: ignore[arg-type]
    opts = Options(B, G, 3, poll_s=0.001, stall_timeout_s=5, max_request_retries=2)
    orch = Orchestrator(preset(name, None), opts, learner, ch, runtime=runtime)
    orch.start()
    with pytest.warns(RuntimeWarning, match=r"prompt 'p1' .* lost with its sampler 3 times"):
        orch.run()
    led = learner.ledger
    assert learner.version == 3 and runtime.restarts == 3  # issued, and issued again twice
    assert led.lost == 2 and led.poisoned == 1 and led.balanced()
    issued = [e[1] for e in events if e[0] == "issue"]
    assert issued.count("p1") == 3
    trained = [p for e in events if e[0] == "train" for p in e[2]]
    assert "p1" not in trained and len(trained) == len(set(trained))
    assert orch.summary()["groups_trained_twice"] == 0


class StuckSampler(FakeSampler):
    """Counts what it generates; starts the request for prompt `stuck` (7 tokens so far) and
    never finishes it."""

    def __init__(self, prompts: FakePrompts, weights: FakeWeights, stuck: str) -> None:
        super().__init__(prompts, weights, in_flight=True)
        self.stuck, self.started, self.tokens = stuck, 0, 0

    def get(self, timeout):
        msg = super().get(timeout)
        if msg is None:
            return None
        self.started += 1
        stuck = msg.request.prompt.id == self.stuck
        self.tokens += 7 if stuck else msg.group.num_tokens
        report = SamplerReport(0, time.perf_counter(), 0.0, started=self.started)
        report.tokens_generated = self.tokens
        if stuck:
            return SamplerMessage("stats", 0, report=report)
        msg.report = report
        return msg


def test_requests_outstanding_at_the_end_are_counted_unfinished_with_their_tokens():
    events: list[tuple] = []
    learner, weights = FakeLearner(events), FakeWeights(events)
    prompts = FakePrompts(events, weights)
    sampler = StuckSampler(prompts, weights, stuck="p2")
    ch = Channels(prompts, sampler, weights, stop=None, num_samplers=1)  # type: ignore[arg-type]
    opts = Options(B, G, 3, lag_policy="keep", poll_s=0.001, stall_timeout_s=5)
    orch = Orchestrator(preset("pipeline", 1), opts, learner, ch)

    def stop_after_step_2() -> None:  # Ctrl-C: the run ends with requests still out
        if learner.version == 2:
            raise KeyboardInterrupt

    orch.health = stop_after_step_2
    trained = []
    train = learner.train
    learner.train = lambda groups: (
        trained.append(sum(g.num_tokens for g in groups)) or train(groups)
    )
    orch.start()
    with pytest.raises(KeyboardInterrupt):
        orch.run()
    unfinished_tokens = orch.settle_unfinished()
    led = learner.ledger
    assert led.unfinished == 1 and led.balanced(), led
    assert led.generated == led.trained + led.unfinished + led.in_flight
    # every token generated was trained or is counted unfinished (keep: nothing stale)
    assert sampler.tokens == sum(trained) + unfinished_tokens and unfinished_tokens >= 7


def test_a_sampler_that_dies_again_before_reporting_had_started_nothing():
    """Sampler 0 dies having started 3 of its requests: 3 lost, the rest sent again as they
    were. Its replacement dies before its first report: it started none of them (the last
    report was its predecessor's: its `started` of 3 counted 3 requests the replacement never
    began as lost, issued them again with a retry used up, and at the end of a run counted
    them unfinished)."""
    events: list[tuple] = []
    learner, weights = FakeLearner(events), FakeWeights(events)
    prompts = FakePrompts(events, weights)
    ch = Channels(prompts, prompts, weights, stop=None, num_samplers=1)  # type: ignore[arg-type]
    orch = Orchestrator(preset("async", 1), Options(B, G, 10, poll_s=0.001), learner, ch)
    orch.start()  # (K + 1) x B requests to sampler 0
    t = time.perf_counter()
    orch.receive(SamplerMessage("stats", 0, report=SamplerReport(0, t, t, started=3)))
    orch.sampler_lost(0)
    assert learner.ledger.lost == 3 and orch.stats.requeued == 2 * B - 3
    orch.issue()  # all of them again, to the replacement's inbox
    orch.sampler_lost(0)  # it died before it reported anything
    assert learner.ledger.lost == 3 and orch.stats.requeued == (2 * B - 3) + 2 * B
    assert all(r.retries <= 1 for r in orch.state.outstanding.values())
    orch.issue()
    assert orch.settle_unfinished() == 0 and learner.ledger.unfinished == 0


def _group(sampler: int, req: PromptRequest, version: int = 0) -> SamplerMessage:
    """The group of `req` as sampler `sampler` sends it (G samples of one token each)."""
    samples = [
        Sample(req.prompt.id, [1], [2], [0.0], [version], FinishReason.STOP, reward=float(g % 2))
        for g in range(req.group_size)
    ]
    t = time.perf_counter()
    return SamplerMessage(
        "group", sampler, req, Group(req.prompt, samples), SamplerReport(sampler, t, 0.0)
    )


def test_a_group_back_from_a_dead_sampler_before_its_resend_is_not_generated_again():
    """Sampler 0 dies before reporting: its requests count as not started and go out again
    as they were. One of its groups still arrives before they do: it is taken, and its
    request is not sent again. (It was: sampler 1 generated it a second time, that late copy
    was dropped without telling the router, so sampler 1's load stayed one too high and its
    death raised KeyError on a request the orchestrator no longer held: the trainer crashed.)"""
    events: list[tuple] = []
    learner, weights = FakeLearner(events), FakeWeights(events)
    inboxes = [FakePrompts(events, weights) for _ in range(2)]
    router = Router(inboxes)  # type: ignore[arg-type]
    ch = Channels(router, inboxes[0], weights, stop=None, num_samplers=2)  # type: ignore[arg-type]
    orch = Orchestrator(preset("async", 1), Options(B, G, 10, poll_s=0.001), learner, ch)
    orch.start()  # (K + 1) x B requests, B to each sampler
    assert router.load == [B, B]
    first = next(g for g, i in router.owner.items() if i == 0)
    orch.sampler_lost(0)
    orch.receive(_group(0, orch.state.outstanding[first]))  # it had started this one
    orch.issue()  # the others go to sampler 1 (sampler 0 is down)
    sent = [r for chunk, _ in inboxes[1].q for r in chunk]
    for req in sent:  # sampler 1 returns all it was sent...
        orch.receive(_group(1, req))
    orch.sampler_lost(1)  # ...then dies holding nothing
    assert len(sent) == 2 * B - 1 and first not in {r.group_id for r in sent}
    led = learner.ledger
    assert led.generated == 2 * B and led.lost == 0 and orch.stats.late_groups == 0
    orch.settle_unfinished()
    assert led.unfinished == 0 and led.in_flight == 2 * B and led.balanced(), led


class Messages(ChannelEnd):
    """The group channel as a plain queue of messages."""

    def __init__(self) -> None:
        self.q: deque[SamplerMessage] = deque()

    def get(self, timeout):
        return self.q.popleft() if self.q else None

    def depth(self):
        return len(self.q)


class QuickRestart:
    """Sampler 0 is dead at the first `check`, which starts its replacement at once (as the
    local runtime does): it is ready before `check` returns, and its `ready` message is in
    the group channel behind its predecessor's last report (`during_drain`), or comes later."""

    def __init__(self, messages: Messages, during_drain: bool) -> None:
        self.messages, self.during_drain = messages, during_drain
        self.ready: SamplerMessage | None = None

    def check(self) -> list[int]:
        if self.ready is not None:
            return []
        t = time.perf_counter()
        self.ready = SamplerMessage("ready", 0, report=SamplerReport(0, t, t))
        if self.during_drain:
            self.messages.q.append(self.ready)
        return [0]


@pytest.mark.parametrize("during_drain", [True, False])
def test_a_replacement_ready_before_its_predecessor_is_settled_is_up(during_drain):
    """The replacement is marked ready and live, and its reports are taken (they were
    ignored as a dead incarnation's, its `ready` undone: it stayed down for the whole run,
    and `wait_ready` timed out)."""
    events: list[tuple] = []
    learner, weights = FakeLearner(events), FakeWeights(events)
    prompts, messages = FakePrompts(events, weights), Messages()
    runtime = QuickRestart(messages, during_drain)
    ch = Channels(prompts, messages, weights, stop=None, num_samplers=1)  # type: ignore[arg-type]
    orch = Orchestrator(preset("async", 1), Options(B, G, 10), learner, ch, runtime=runtime)
    t0 = time.perf_counter()
    orch.receive(SamplerMessage("ready", 0, report=SamplerReport(0, t0, t0)))
    orch.start()
    t1 = time.perf_counter()  # the first incarnation's last report, then it dies
    messages.q.append(SamplerMessage("stats", 0, report=SamplerReport(0, t1, t0, started=3)))
    orch.recover()
    if not during_drain:
        assert runtime.ready is not None
        orch.receive(runtime.ready)
    assert learner.ledger.lost == 3 and orch.stats.requeued == 2 * B - 3  # its last report
    assert orch.state.ready == {0} and orch.router.live == [True]
    assert orch.stats.reports[0].t_ready == runtime.ready.report.t_ready  # type: ignore[union-attr]


class FailingLearner(FakeLearner):
    """Settling (having counted one group filtered) or training step 1's groups raises."""

    def __init__(self, events: list[tuple], where: str) -> None:
        super().__init__(events)
        self.where = where

    def settle(self, groups):
        if self.where == "settle" and self.version == 1:
            self.ledger.filtered["fake"] += 1  # part-way through
            raise RuntimeError("settle failed")
        return super().settle(groups)

    def train(self, groups):
        if self.where == "train" and self.version == 1:
            raise RuntimeError("train failed: CUDA out of memory")
        return super().train(groups)


@pytest.mark.parametrize("where", ["settle", "train"])
@pytest.mark.parametrize("name", ["sync", "async"])
def test_an_error_closing_a_window_leaves_its_groups_in_flight(name, where):
    """The run ends with the error, and its ledger (written on the way out) still adds up:
    the window's groups are in flight, not half filtered or gone (a trainer out of memory
    lost the step's groups from the ledger)."""
    events: list[tuple] = []
    learner, weights = FailingLearner(events, where), FakeWeights(events)
    prompts = FakePrompts(events, weights)
    sampler = FakeSampler(prompts, weights, in_flight=name != "sync")
    ch = Channels(prompts, sampler, weights, stop=None, num_samplers=1)  # type: ignore[arg-type]
    opts = Options(B, G, 5, poll_s=0.001, stall_timeout_s=5)
    orch = Orchestrator(preset(name, None), opts, learner, ch)
    orch.start()
    with pytest.raises(RuntimeError, match=f"{where} failed"):
        orch.run()
    orch.settle_unfinished()
    led = learner.ledger
    assert led.trained == B and sum(led.filtered.values()) == 0 and led.in_flight >= B, led
    assert led.balanced(), led
