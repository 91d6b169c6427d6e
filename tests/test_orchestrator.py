"""The orchestrator's ordering, admission and lag policy, with fakes that record events.

A fake learner trains by bumping its version; a fake sampler serves prompt requests from the
orchestrator's own prompt channel, one group per `groups.get`, stamping each token with the
weights version it generates with (loaded at each batch start, or at each group in flight).
Everything runs in this process and in a fixed order, so each test asserts exact sequences.
"""

from __future__ import annotations

from collections import deque

import pytest

from slipstream.runtime.channels import (
    ChannelEnd,
    Channels,
    PromptRequest,
    SamplerMessage,
    SamplerReport,
)
from slipstream.schedule.ledger import Ledger
from slipstream.schedule.orchestrator import Options, Orchestrator
from slipstream.schedule.presets import preset
from slipstream.schedule.tail import LengthModel
from slipstream.types import FinishReason, Group, Prompt, Sample

B, G = 4, 2


class FakeLearner:
    def __init__(self, events: list[tuple], filtered: set[int] = frozenset()) -> None:
        self.events = events
        self.ledger = Ledger()
        self.version = 0
        self.draws = 0
        self.filtered = filtered  # prompt numbers whose groups the filters drop
        self.records: list[dict] = []

    def draw(self, n: int) -> list[Prompt]:
        out = [
            Prompt(f"p{self.draws + i}", "x" * (1 + (self.draws + i) % 5), None) for i in range(n)
        ]
        self.draws += n
        return out

    def group_sizes(self, prompts: list[Prompt]) -> list[int]:
        return [G] * len(prompts)

    def seeds(self, prompt: Prompt, n: int) -> list[int]:
        return [int(prompt.id[1:]) * 100 + g for g in range(n)]

    def settle(self, groups: list[Group]) -> list[Group]:
        kept = [g for g in groups if int(g.prompt.id[1:]) not in self.filtered]
        self.ledger.filtered["fake"] += len(groups) - len(kept)
        return kept

    def train(self, groups: list[Group]) -> dict:
        lags = [self.version - v for g in groups for s in g.samples for v in s.versions_T]
        self.events.append(("train", self.version, tuple(g.prompt.id for g in groups), max(lags)))
        self.version += 1
        return {"tokens/trained": float(sum(g.num_tokens for g in groups))}

    def publish(self, channels: Channels) -> float:
        channels.weights.publish({}, self.version)
        return 0.0

    def after_step(self, record: dict, groups: list[Group]) -> None:
        self.events.append(("record", record["step"]))
        self.records.append(record)


class FakeWeights:
    def __init__(self, events: list[tuple]) -> None:
        self.events, self.v = events, 0

    def publish(self, params, version: int) -> float:
        self.events.append(("publish", version))
        self.v = version
        return 0.0

    def version(self) -> int:
        return self.v

    def read(self, newer_than, timeout):  # pragma: no cover - the fake sampler reads .v
        raise NotImplementedError


class FakePrompts(ChannelEnd):
    """Records each issue; keeps the weights version current when it was issued (an idle
    sampler starts a batch at once, with the weights it then holds)."""

    def __init__(self, events: list[tuple], weights: FakeWeights, on_issue=None) -> None:
        self.q: deque[tuple[list[PromptRequest], int]] = deque()
        self.events, self.weights, self.on_issue = events, weights, on_issue

    def put(self, requests, timeout):
        for r in requests:
            self.events.append(("issue", r.prompt.id, r.batch, r.issue_version))
            if self.on_issue:
                self.on_issue(r)
        self.q.append((requests, self.weights.v))
        return True

    def get(self, timeout):
        return self.q.popleft() if self.q else None

    def depth(self):
        return len(self.q)


class FakeSampler(ChannelEnd):
    """Serves requests in order, one group per `get`. `in_flight`: each group takes the
    latest version; else the version at the start of its chunk. `hold`: prompt ids whose
    groups come back only when nothing else is left (slow, hard groups)."""

    def __init__(
        self, prompts: FakePrompts, weights: FakeWeights, in_flight: bool, hold=(), lengths=None
    ):
        self.prompts, self.weights, self.in_flight = prompts, weights, in_flight
        self.chunk: deque[tuple[PromptRequest, int]] = deque()
        self.held: deque[tuple[PromptRequest, int]] = deque()
        self.hold = set(hold)
        self.lengths = lengths or (lambda p: len(p.text))

    def put(self, message, timeout):  # pragma: no cover
        raise NotImplementedError

    def depth(self):
        return 0

    def get(self, timeout):
        while True:
            while self.chunk and self.chunk[0][0].prompt.id in self.hold:
                self.held.append(self.chunk.popleft())
            nxt = None if self.chunk else self.prompts.get(0)
            if nxt is None:
                break
            self.chunk.extend((r, nxt[1]) for r in nxt[0])
        if self.chunk:
            req, v = self.chunk.popleft()
        elif self.held:
            req, v = self.held.popleft()
        else:
            return None
        v = self.weights.v if self.in_flight and req.prompt.id not in self.hold else v
        n = self.lengths(req.prompt)
        samples = [
            Sample(
                req.prompt.id,
                [1],
                [2] * n,
                [0.0] * n,
                [v] * n,
                FinishReason.STOP,
                reward=float(g % 2),
            )
            for g in range(req.group_size)
        ]
        report = SamplerReport(0, 0.0, 0.0)
        return SamplerMessage(
            "group", 0, request=req, group=Group(req.prompt, samples), report=report
        )


def _orchestrate(
    name, steps=5, max_lag=None, policy="drop", hold=(), filtered=frozenset(), on_issue=None, **opts
):
    events: list[tuple] = []
    spec = preset(name, max_lag)
    learner = FakeLearner(events, filtered)
    weights = FakeWeights(events)
    prompts = FakePrompts(events, weights, on_issue)
    sampler = FakeSampler(prompts, weights, spec.weight_sync == "in_flight", hold)
    ch = Channels(prompts, sampler, weights, stop=None, num_samplers=1)  # type: ignore[arg-type]
    orch = Orchestrator(
        spec,
        Options(B, G, steps, lag_policy=policy, poll_s=0.001, stall_timeout_s=5, **opts),
        learner,
        ch,
    )
    if on_issue is not None:
        on_issue.orch = orch
    orch.start()
    orch.run()
    return events, orch, learner


def test_sync_issues_a_batch_only_after_the_previous_steps_weights():
    events, _, learner = _orchestrate("sync")
    published = 0
    for e in events:
        if e[0] == "publish":
            published = e[1]
        if e[0] == "issue":
            batch, issue_version = e[2], e[3]
            assert batch == published == issue_version  # batch n waits for version n
    trains = [e for e in events if e[0] == "train"]
    assert [t[1] for t in trains] == [0, 1, 2, 3, 4]
    assert all(t[3] == 0 for t in trains)  # every token on-policy
    assert [t[2] for t in trains][:2] == [("p0", "p1", "p2", "p3"), ("p4", "p5", "p6", "p7")]
    assert learner.ledger.generated == learner.ledger.trained == 20


def test_double_buffer_stays_exactly_one_batch_ahead():
    events, _, _ = _orchestrate("double_buffer", steps=6)
    issued = {}
    for i, e in enumerate(events):
        if e[0] == "issue":
            issued.setdefault(e[2], i)
    publishes = [(i, e[1]) for i, e in enumerate(events) if e[0] == "publish"]
    assert sorted(issued) == list(range(6))  # no batch beyond the last step's
    assert issued[1] < publishes[0][0]  # batches 0 and 1 go out before any step
    at = {v: i for i, v in publishes}
    for b in range(2, 6):
        # batch b goes out right after version b - 1 is published, before version b is
        assert at[b - 1] < issued[b] < at[b]
    assert max(e[3] for e in events if e[0] == "train") == 1


class _AdmissionProbe:
    """Checks AReaL's bound at every issue: accepted + running <= (K + windows + 1) x B."""

    orch: Orchestrator

    def __init__(self) -> None:
        self.peak = 0

    def __call__(self, req: PromptRequest) -> None:
        st = self.orch.state
        running = st.issued - st.out_of_bound  # the new request included
        K = self.orch.spec.max_lag
        assert running <= (K + st.windows + 1) * B, (running, st.windows)
        self.peak = max(self.peak, running - st.windows * B)


@pytest.mark.parametrize("name", ["async", "pipeline"])
def test_continuous_admission_bound_is_respected_and_reached(name):
    probe = _AdmissionProbe()
    events, _, _ = _orchestrate(name, steps=6, max_lag=2, on_issue=probe)
    assert probe.peak == (2 + 1) * B  # the bound is tight, not just respected
    assert max(e[3] for e in events if e[0] == "train") <= 2


def test_slow_group_beyond_k_is_dropped_as_stale_and_never_trained():
    events, orch, learner = _orchestrate("async", steps=6, max_lag=1, hold={"p0"})
    trained = {p for e in events if e[0] == "train" for p in e[2]}
    assert "p0" not in trained
    assert learner.ledger.stale == 1
    assert all(e[3] <= 1 for e in events if e[0] == "train")
    led = learner.ledger
    led.in_flight = orch.leftover()
    assert led.balanced()


def test_keep_policy_trains_the_slow_group_with_its_lag():
    events, _, learner = _orchestrate("async", steps=6, max_lag=1, policy="keep", hold={"p0"})
    p0 = [e for e in events if e[0] == "train" and "p0" in e[2]]
    assert learner.ledger.stale == 0 and len(p0) == 1 and p0[0][3] > 1


def test_a_fully_filtered_window_closes_without_a_step():
    events, orch, learner = _orchestrate("sync", steps=3, filtered={0, 1, 2, 3})
    trains = [e for e in events if e[0] == "train"]
    assert len(trains) == 3 and trains[0][2] == ("p4", "p5", "p6", "p7")
    assert orch.state.windows == 4
    assert learner.ledger.filtered["fake"] == 4 and learner.ledger.trained == 12


@pytest.mark.parametrize("name", ["sync", "pipeline"])
def test_dynamic_sampling_refills_filtered_groups_within_the_window(name):
    events, _, learner = _orchestrate(
        name, steps=2, filtered={0, 1, 5}, dynamic_sampling=True, max_extra_draws=2
    )
    trains = [e[2] for e in events if e[0] == "train"]
    # window 1: p0 and p1 are filtered, two extra draws (the bound) bring p4 and p5, p5 is
    # filtered too: the step trains on the 3 it has (DAPO's bound). Window 2 is p6..p9.
    assert trains == [("p2", "p3", "p4"), ("p6", "p7", "p8", "p9")]
    assert learner.ledger.filtered["fake"] == 3 and learner.ledger.trained == 7


def test_tail_batching_issues_short_prompts_together():
    events, _, _ = _orchestrate("tail_batching", steps=12)
    # after the first pool the length model knows each prompt length; later pools go out
    # shortest first, so the issue order of a pool is sorted by prompt length
    issued = [e[1] for e in events if e[0] == "issue"]
    pool = issued[16:32]
    lengths = [1 + int(p[1:]) % 5 for p in pool]
    assert lengths == sorted(lengths)


def test_length_model_prefers_the_prompt_then_its_size_then_the_mean():
    m = LengthModel(decay=0.5)
    a, b, c = Prompt("a", "1+2=", None), Prompt("b", "3+4=", None), Prompt("c", "1+2+3=", None)
    assert m.expected(a) == 0.0
    m.update(a, [4, 6])
    assert m.expected(a) == 5.0 and m.expected(b) == 5.0 and m.expected(c) == 5.0
    m.update(c, [20])
    m.update(a, [1])  # EMA: 0.5 * 5 + 0.5 * 1
    assert m.expected(a) == 3.0 and m.expected(b) == 3.0 and m.expected(c) == 20.0
    assert [p.id for p in m.order([c, b, a])] == ["b", "a", "c"]  # a and b tie: drawn order


@pytest.mark.parametrize("name", ["double_buffer", "pipeline"])
def test_checkpointed_state_round_trips_through_json(name):
    """What a checkpoint holds of the pipeline (requests out, prompts drawn, groups back) comes
    back equal, and the restored requests are the first to go out again."""
    import json

    snapshots = []

    class Capture:  # the orchestrator checkpoints from `after_step`: snapshot there
        orch = None

        def __call__(self, req):
            if req.group_id == 0:
                inner = self.orch.learner.after_step
                self.orch.learner.after_step = lambda record, groups: (
                    inner(record, groups),
                    snapshots.append(self.orch.state_dict()) if record["step"] == 2 else None,
                )

    _, orch, _ = _orchestrate(name, steps=4, on_issue=Capture())
    d = json.loads(json.dumps(snapshots[0]))
    assert d["requests"] or d["window"] or d["batches"]  # there is work in flight to keep
    events: list[tuple] = []
    again = Orchestrator(
        preset(name, None), Options(B, G, 5, poll_s=0.001), FakeLearner(events), orch.ch
    )
    again.load_state_dict(d)
    assert json.loads(json.dumps(again.state_dict())) == d
    assert [r.group_id for chunk in again.state.reissue for r in chunk] == [
        r["group_id"] for r in d["requests"]
    ]


def test_discard_counts_groups_in_the_ledger_and_their_tokens_in_the_step():
    """`step_stats.discard`: the one count of groups a rollback's undoing drops (on arrival,
    waiting in a window, in a replay): one ledger entry and its tokens each."""
    from slipstream.schedule.step_stats import StepStats, discard

    def group(pid: str, n: int) -> Group:
        s = Sample(pid, [1], [2] * n, [0.0] * n, [0] * n, FinishReason.STOP)
        return Group(Prompt(pid, "x", None), [s, s])

    led, st = Ledger(), StepStats()
    discard(led, st, [group("a", 3), group("b", 1)])
    discard(led, st, [])
    assert (led.discarded, st.discarded_tokens) == (2, 8)


def test_a_group_trained_twice_is_counted_by_prompt_and_seeds():
    from slipstream.schedule.step_stats import StepStats

    def group(pid, seeds):
        p = Prompt(pid, "x", None)
        return Group(
            p, [Sample(pid, [1], [2], [0.0], [0], FinishReason.STOP, seed=s) for s in seeds]
        )

    st = StepStats()
    st.trained_keys([group("a", (1, 2)), group("a", (3, 4)), group("b", (1, 2))])
    assert st.trained_twice == 0  # same prompt other seeds, same seeds other prompt: new draws
    st.trained_keys([group("a", (2, 1))])  # the same draw, members in another order
    assert st.trained_twice == 1


def _arrive(orch: Orchestrator, n: int, version: int) -> None:
    """`n` groups whose every token has `version` arrive (requests made on the spot)."""
    learner = orch.learner
    for prompt, g in zip(learner.draw(n), learner.group_sizes([None] * n)):
        req = orch._request(prompt, g, batch=-1)
        samples = [
            Sample(
                prompt.id, [1], [2, 2], [0.0, 0.0], [version] * 2, FinishReason.STOP, float(i % 2)
            )
            for i in range(g)
        ]
        group = Group(prompt, samples)
        orch.receive(SamplerMessage("group", 0, request=req, group=group))


def _bare(name: str, max_lag: int, **opts) -> tuple[list[tuple], Orchestrator, FakeLearner]:
    events: list[tuple] = []
    learner = FakeLearner(events)
    weights = FakeWeights(events)
    prompts = FakePrompts(events, weights)
    ch = Channels(prompts, prompts, weights, stop=None, num_samplers=1)  # type: ignore[arg-type]
    spec = preset(name, max_lag)
    orch = Orchestrator(spec, Options(B, G, 10, poll_s=0.001, **opts), learner, ch)
    return events, orch, learner


def test_no_group_trains_beyond_k_when_several_windows_close_at_once():
    # Three windows' worth of version-0 groups are back at once (as after a recovery drains a
    # dead sampler's messages). Windows 1 and 2 train them at lags 0 and 1 = K; the third
    # window's groups would train at lag 2 > K: under `drop` they are stale instead.
    events, orch, learner = _bare("async", max_lag=1)
    _arrive(orch, 3 * B, version=0)
    orch._close_ready_windows()
    lags = [e[3] for e in events if e[0] == "train"]
    assert lags == [0, 1]
    assert learner.ledger.stale == B and learner.ledger.trained == 2 * B
    assert orch.state.out_of_bound == B  # their admission slots are free again
    led = learner.ledger
    led.in_flight = orch.leftover()
    assert led.balanced()


def test_keep_trains_aged_groups_with_their_lag():
    events, orch, learner = _bare("async", max_lag=1, lag_policy="keep")
    _arrive(orch, 3 * B, version=0)
    orch._close_ready_windows()
    assert [e[3] for e in events if e[0] == "train"] == [0, 1, 2]
    assert learner.ledger.stale == 0


class _LagLearner(FakeLearner):
    def train(self, groups: list[Group]) -> dict:
        lags = [self.version - g.oldest_version for g in groups]
        self.events.append(("lags", self.version, min(lags), max(lags)))
        return super().train(groups)


def _min_lag_run(in_flight: bool, filtered=frozenset()) -> tuple[list[tuple], FakeLearner]:
    events: list[tuple] = []
    spec = preset("pipeline", 2)
    learner = _LagLearner(events, filtered)
    weights = FakeWeights(events)
    prompts = FakePrompts(events, weights)
    sampler = FakeSampler(prompts, weights, in_flight=in_flight)
    ch = Channels(prompts, sampler, weights, stop=None, num_samplers=1)  # type: ignore[arg-type]
    opts = Options(B, G, 8, poll_s=0.001, stall_timeout_s=5, min_lag=2)
    orch = Orchestrator(spec, opts, learner, ch)
    orch.start()
    orch.run()
    return [(v, lo, hi) for kind, v, lo, hi in (e for e in events if e[0] == "lags")], learner


def test_min_lag_trains_on_data_exactly_k_versions_old():
    # a sampler that starts each request with the weights of the moment it was issued
    lags, learner = _min_lag_run(in_flight=False)
    # the first steps train what there is (lag = version), then exactly K = 2 every step
    assert lags == [(v, min(v, 2), min(v, 2)) for v in range(8)]
    assert learner.ledger.stale == 0


def test_min_lag_never_starves_when_samplers_start_requests_late():
    # this sampler serves lazily under the newest weights, so groups are younger than their
    # requests: held by token version they would never ripen while admission waits for them
    lags, learner = _min_lag_run(in_flight=True)
    assert len(lags) == 8 and all(hi <= 2 for _, _, hi in lags)
    assert learner.ledger.stale == 0


def test_min_lag_goes_on_through_windows_that_train_nothing():
    # windows 2 and 3 are wholly filtered: the version stays while windows close, so holding
    # by versions would wait forever; by windows the run trains its 8 steps
    lags, learner = _min_lag_run(in_flight=False, filtered=frozenset(range(4, 12)))
    assert len(lags) == 8 and learner.ledger.filtered["fake"] == 8


def test_a_watchdog_tighten_puts_the_next_window_under_k0():
    """`tighten` at step 1 (the learning rate is lowered from step 2): window 2 is under
    K = 0 too. Its version-0 groups, lag 1 at version 1, are stale under `drop`; K stayed 2
    for one window more (trained at lag 1), and K = 0 began a window late."""
    from slipstream.schedule.auto_lag import LagControl, tighten_hook

    events, orch, learner = _bare("async", max_lag=2)
    orch.lag_control = ctl = LagControl(None, fixed_k=2)
    hook, records = tighten_hook(ctl, orch), []

    def after_step(record: dict, groups: list[Group]) -> None:
        if record["step"] == 1:
            hook(3, record)  # as the watchdog calls it, before the record is written
        records.append(record)

    learner.after_step = after_step  # type: ignore[method-assign]
    _arrive(orch, 2 * B, version=0)
    orch._close_ready_windows()
    assert [e[3] for e in events if e[0] == "train"] == [0]
    assert learner.ledger.stale == B and orch.spec.max_lag == 0
    assert records[0]["schedule/max_lag"] == 0
    assert records[0]["schedule/max_lag_reason"] == "watchdog_tighten"


def test_a_resumed_tail_batching_run_sorts_its_next_pool_as_the_unbroken_one():
    """The checkpoint holds what tail batching learned of completion lengths: restored, the
    next pool is ordered as the unbroken run orders it (it held none: the restored run's
    model knew no prompt, so its first pools kept their drawn order)."""
    import json

    _, orch, _ = _orchestrate("tail_batching", steps=3)  # learned lengths 1..5 per prompt
    again = Orchestrator(
        preset("tail_batching", None), Options(B, G, 5, poll_s=0.001), FakeLearner([]), orch.ch
    )
    again.load_state_dict(json.loads(json.dumps(orch.state_dict())))
    pool = [Prompt(f"p{i}", "x" * (1 + i % 5), None) for i in range(8)]
    expected = [orch.lengths.expected(p) for p in pool]
    assert len(set(expected)) > 1  # the order is the model's, not the draw's
    assert [again.lengths.expected(p) for p in pool] == expected
    assert again.lengths.order(pool) == orch.lengths.order(pool)


def test_a_group_discarded_after_a_rollback_counts_its_tokens_as_wasted():
    """A group holding a token of a version a rollback undid is discarded on arrival
    (`Orchestrator.reject`): its tokens never reach a loss, so they are in `tokens/wasted`
    (and `tokens/discarded`), as stale groups' are. They were counted nowhere, so goodput
    read them as useful generation."""

    class RejectP1:
        orch: Orchestrator

        def __call__(self, request: PromptRequest) -> None:
            self.orch.reject = lambda group: group.prompt.id == "p1"

    _, _, learner = _orchestrate("pipeline", on_issue=RejectP1())
    assert learner.ledger.discarded == 1
    discarded = sum(r["tokens/discarded"] for r in learner.records)
    assert discarded == G * len("xx")  # p1's group: G samples of len(prompt text) tokens
    assert sum(r["tokens/wasted"] for r in learner.records) == discarded  # nothing else wasted
