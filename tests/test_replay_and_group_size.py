"""Adaptive group size (budget, optimality, determinism) and the replay buffer."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.schedule.group_size import (
    allocate_group_sizes,
    expected_informative,
    informative_prob,
)
from slipstream.schedule.replay import ReplayBuffer
from slipstream.types import FinishReason, Group, Prompt, Sample


def test_informative_prob_golden() -> None:
    # p = 0.5, G = 2: 1 - 0.25 - 0.25 = 0.5; p = 0.1, G = 3: 1 - 0.001 - 0.729 = 0.27.
    assert informative_prob(0.5, 2) == pytest.approx(0.5)
    assert informative_prob(0.1, 3) == pytest.approx(0.27)


def test_hard_prompts_get_more_samples() -> None:
    # Budget 16 over p = [0.5, 0.1], G in [2, 12]: 12 samples to place beyond g_min.
    # Increments p^G (1-p) + (1-p)^G p from G = 2 on:
    #   p=0.5: 0.25, 0.125, 0.0625, 0.03125, ...
    #   p=0.1: 0.09, 0.0738, 0.0657, 0.0591, 0.0531, 0.0478, 0.0431, 0.0387, 0.0349, 0.0314, ...
    # The 12 largest: three of p=0.5 (down to 0.0625) and nine of p=0.1 (down to 0.0349).
    assert allocate_group_sizes([0.5, 0.1], budget=16, g_min=2, g_max=12) == [5, 11]
    # A prompt that can never be informative (p = 0) gets only g_min while others have room.
    assert allocate_group_sizes([0.0, 0.3], budget=8, g_min=2, g_max=6) == [2, 6]


@given(
    rates=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
    g_min=st.integers(1, 3),
    span=st.integers(0, 3),
    data=st.data(),
)
@settings(max_examples=60, deadline=None)
def test_allocation_keeps_budget_bounds_and_is_optimal(rates, g_min, span, data) -> None:
    g_max = g_min + span
    budget = data.draw(st.integers(len(rates) * g_min, len(rates) * g_max))
    sizes = allocate_group_sizes(rates, budget, g_min, g_max)
    assert sum(sizes) == budget and all(g_min <= g <= g_max for g in sizes)
    assert sizes == allocate_group_sizes(rates, budget, g_min, g_max)  # deterministic
    # Brute force over every feasible allocation: greedy reaches the best expected count.
    best = max(
        expected_informative(rates, combo)
        for combo in itertools.product(range(g_min, g_max + 1), repeat=len(rates))
        if sum(combo) == budget
    )
    assert expected_informative(rates, sizes) == pytest.approx(best, abs=1e-9)


def test_allocation_rejects_infeasible_budgets() -> None:
    with pytest.raises(ValueError, match="budget 3"):
        allocate_group_sizes([0.5, 0.5], budget=3, g_min=2, g_max=8)
    with pytest.raises(ValueError, match="g_min"):
        allocate_group_sizes([0.5], budget=4, g_min=0, g_max=8)
    with pytest.raises(ValueError, match="pass rates"):
        allocate_group_sizes([1.5], budget=4, g_min=2, g_max=8)


def _sample(pid: str, reward: float, tokens: list[int], version: int = 0) -> Sample:
    return Sample(
        prompt_id=pid,
        prompt_tokens=[1, 2],
        completion_tokens=tokens,
        behavior_logp_T=[-0.5] * len(tokens),
        versions_T=[version] * len(tokens),
        finish_reason=FinishReason.STOP,
        reward=reward,
    )


def _group(pid: str, rewards: list[float], version: int = 0, offset: int = 0) -> Group:
    samples = [_sample(pid, r, [offset + i, 7], version) for i, r in enumerate(rewards)]
    return Group(Prompt(pid, "q", "a"), samples)


def test_replay_mixes_stored_successes_into_failed_groups() -> None:
    buf = ReplayBuffer(capacity_per_prompt=2)
    assert buf.add(_group("p", [1.0, 0.0, 1.0], version=3)) == 2
    failed = _group("p", [0.0, 0.0, 0.0, 0.0], version=9, offset=100)
    samples, n = buf.mix_into(failed, k=1, rng=random.Random(0))
    assert n == 1 and len(samples) == 4
    replayed = [s for s in samples if s.reward == 1.0]
    assert len(replayed) == 1
    # The replayed sample keeps its own behaviour log-probs and versions (lag is real).
    assert replayed[0].versions_T == [3, 3] and replayed[0].behavior_logp_T == [-0.5, -0.5]
    assert [s.reward for s in failed.samples] == [0.0] * 4  # the input group is untouched
    # Same seed, same result.
    again, _ = buf.mix_into(failed, k=1, rng=random.Random(0))
    assert [s.completion_tokens for s in again] == [s.completion_tokens for s in samples]


def test_replay_leaves_successful_groups_and_unknown_prompts_alone() -> None:
    buf = ReplayBuffer()
    buf.add(_group("p", [1.0, 0.0]))
    ok = _group("p", [0.0, 1.0], offset=50)
    assert buf.mix_into(ok, k=2, rng=random.Random(1)) == (ok.samples, 0)
    other = _group("q", [0.0, 0.0])
    assert buf.mix_into(other, k=2, rng=random.Random(1))[1] == 0
    # k larger than what is stored replays only what exists.
    assert buf.mix_into(_group("p", [0.0] * 4, offset=60), k=3, rng=random.Random(1))[1] == 1


def test_replay_capacity_dedup_and_copy() -> None:
    buf = ReplayBuffer(capacity_per_prompt=2)
    for offset in (0, 10, 20):
        buf.add(_group("p", [1.0], offset=offset))
    assert [s.completion_tokens[0] for s in buf.successes("p")] == [10, 20]  # newest kept
    assert buf.add(_group("p", [1.0], offset=20)) == 0  # same completion: stored once
    samples, _ = buf.mix_into(_group("p", [0.0], offset=90), k=1, rng=random.Random(0))
    samples[0].behavior_logp_T[0] = 99.0
    assert all(s.behavior_logp_T[0] == -0.5 for s in buf.successes("p"))


def test_replay_state_round_trip_is_json() -> None:
    buf = ReplayBuffer(capacity_per_prompt=3)
    buf.add(_group("p", [1.0, 1.0], version=2))
    buf.add(_group("q", [0.0, 1.0], version=5))
    state = json.loads(json.dumps(buf.state_dict()))
    restored = ReplayBuffer(capacity_per_prompt=3)
    restored.load_state_dict(state)
    assert restored.successes("p") == buf.successes("p")
    assert restored.successes("q") == buf.successes("q") and len(restored) == 3
    assert restored.successes("q")[0].finish_reason is FinishReason.STOP


def test_replay_validates_capacity() -> None:
    with pytest.raises(ValueError, match="capacity_per_prompt"):
        ReplayBuffer(capacity_per_prompt=0)


def test_replay_keeps_kept_logmass_and_reads_records_without_it() -> None:
    buf = ReplayBuffer()
    g = _group("p", [1.0])
    g.samples[0].kept_logmass_T = [-0.25, -0.5]
    buf.add(g)
    state = json.loads(json.dumps(buf.state_dict()))
    restored = ReplayBuffer()
    restored.load_state_dict(state)
    assert restored.successes("p")[0].kept_logmass_T == [-0.25, -0.5]
    samples, _ = restored.mix_into(_group("p", [0.0], offset=9), k=1, rng=random.Random(0))
    samples[0].kept_logmass_T[0] = 9.0  # a copy: the store is untouched
    assert restored.successes("p")[0].kept_logmass_T == [-0.25, -0.5]
    for items in state["samples"].values():  # a record written before the field existed
        for d in items:
            del d["kept_logmass_T"]
    old = ReplayBuffer()
    old.load_state_dict(state)
    assert old.successes("p")[0].kept_logmass_T is None


def test_checkpointed_groups_keep_kept_logmass_and_read_old_records() -> None:
    from dataclasses import asdict

    from slipstream.schedule.pipeline_state import _group_from_json

    g = _group("p", [1.0, 0.0])
    g.samples[0].kept_logmass_T = [-0.25, -0.5]
    d = json.loads(json.dumps(asdict(g)))
    assert [s.kept_logmass_T for s in _group_from_json(d).samples] == [[-0.25, -0.5], None]
    for s in d["samples"]:  # a checkpoint written before the field existed
        del s["kept_logmass_T"]
    assert [s.kept_logmass_T for s in _group_from_json(d).samples] == [None, None]
    with pytest.raises(ValueError, match="kept masses"):
        Sample("p", [1], [2, 3], [0.0, 0.0], [0, 0], FinishReason.STOP, kept_logmass_T=[0.0])


def test_a_checkpointed_group_keeps_its_masked_count() -> None:
    """`Group.masked` (sequences overlong `mask_loss` took out, still counted by TRL's
    per-sequence normalisers) is written with the group (asdict) and read back; a checkpoint
    written before the field existed reads as 0."""
    from dataclasses import asdict

    from slipstream.schedule.pipeline_state import _group_from_json

    g = _group("p", [1.0, 0.0])
    g.masked = 2
    d = json.loads(json.dumps(asdict(g)))
    assert _group_from_json(d).masked == 2
    del d["masked"]
    assert _group_from_json(d).masked == 0
