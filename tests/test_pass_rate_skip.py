"""The probabilistic pass-rate band (`skip_prob < 1`, GRESO-style selective rollouts)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.algo import filters
from slipstream.schedule.pass_rate import PassRateTracker

FAIL, PASS, MIXED = [0.0] * 8, [1.0] * 8, [1.0, 0.0] * 4


def test_skip_probability_grows_with_the_streak():
    # s = 0.5: skipped with probability 1 - 0.5^z after z groups in a row outside the band:
    # z = 1 -> 0.5, z = 2 -> 0.75, z = 3 -> 0.875; a group inside the band resets z to 0.
    t = PassRateTracker(skip_prob=0.5, min_attempts=8)
    assert t.skip_probability("h") == 0.0  # unseen
    expected = [0.5, 0.75, 0.875]
    for z, p in enumerate(expected, start=1):
        t.update("h", FAIL)
        assert t.skip_probability("h") == pytest.approx(p), z
    # 4/32 = 0.125 overall: back inside the band, drawn whatever the streak was
    t.update("h", [1.0] * 4 + [0.0] * 4)
    assert t.skip_probability("h") == 0.0
    t.update("h", FAIL)  # 4/40 = 0.1: still inside (low = 0.05), streak 1
    assert t.skip_probability("h") == 0.0
    t.update("m", PASS)  # mastered: 8/8, streak 1
    assert t.skip_probability("m") == pytest.approx(0.5)


def test_streak_zero_draws_an_excluded_prompt():
    # 1/8 then 0/40: overall 1/48 is below low = 0.05, but a fresh in-band group (1/8 = 0.125)
    # sets the streak to 0, and (1 - s)^0 = 1: always drawn.
    t = PassRateTracker(skip_prob=0.9)
    for _ in range(5):
        t.update("h", FAIL)
    t.update("h", [1.0] + [0.0] * 7)
    assert t.pass_rate("h") == pytest.approx(1 / 48)
    assert [t.should_draw("h") for _ in range(5)] == [(True, "explore")] * 5


def test_hard_band_is_skip_prob_one():
    t = PassRateTracker()  # skip_prob 1
    t.update("h", FAIL)
    assert t.skip_probability("h") == 1.0
    assert [t.should_draw("h")[0] for _ in range(20)] == [False] * 20


def test_skip_frequency_matches_the_rule():
    # 4000 prompts each after two failed groups, s = 0.5: drawn with probability 0.25.
    t = PassRateTracker(skip_prob=0.5, seed=3)
    ids = [f"p{i}" for i in range(4000)]
    for pid in ids:
        t.update(pid, FAIL)
        t.update(pid, FAIL)
    drawn = [t.should_draw(pid) for pid in ids]
    assert {r for ok, r in drawn if ok} == {"explore"}
    assert {r for ok, r in drawn if not ok} == {filters.PASS_RATE_BAND}
    assert sum(ok for ok, _ in drawn) / len(ids) == pytest.approx(0.25, abs=0.025)


def test_decisions_are_reproducible_and_depend_on_the_seed():
    def decisions(seed: int) -> list[bool]:
        t = PassRateTracker(skip_prob=0.5, seed=seed)
        out = []
        for i in range(200):
            t.update(f"p{i % 20}", FAIL)
            out.append(t.should_draw(f"p{(7 * i) % 20}")[0])
        return out

    assert decisions(0) == decisions(0)
    assert decisions(0) != decisions(1)


def test_repeated_skips_draw_new_numbers():
    # Each skip changes the hash input (skips + 1), so a prompt is not stuck on one number:
    # with streak 1 and s = 0.5 it is drawn within a few tries.
    t = PassRateTracker(skip_prob=0.5)
    t.update("h", FAIL)
    tries = 1
    while not t.should_draw("h")[0]:
        tries += 1
        assert tries < 30
    assert t.should_draw("h") in ((True, "explore"), (False, filters.PASS_RATE_BAND))


def test_state_round_trip_keeps_the_streak_and_reads_old_snapshots():
    t = PassRateTracker(skip_prob=0.5)
    t.update("h", FAIL)
    t.update("h", FAIL)
    restored = PassRateTracker(skip_prob=0.5)
    restored.load_state_dict(t.state_dict())
    assert restored.state_dict() == t.state_dict() == {"records": {"h": [0, 16, None, 2, 0]}}
    assert restored.skip_probability("h") == pytest.approx(0.75)
    restored.load_state_dict({"records": {"h": [0, 16, None]}})  # before the streak existed
    assert restored.skip_probability("h") == 0.0  # streak 0: drawn until its next group


@pytest.mark.parametrize("settings", [{"skip_prob": 0.5}, {"retry_after": 3}])
def test_a_tracker_restored_mid_run_decides_as_the_uninterrupted_one(settings):
    """The skip decision hashes the skips since a prompt's last group (and re-admission counts
    them), so a checkpoint must hold them: the decisions after a JSON round trip of the
    state, taken between two draws, are those of the tracker that went on."""

    def step(t: PassRateTracker, i: int) -> bool:
        if i % 50 == 0:  # every prompt starts outside the band; now and then one more group
            for j in range(5) if i == 0 else [i // 50]:
                t.update(f"p{j}", FAIL)
        return t.should_draw(f"p{i % 5}")[0]

    whole = PassRateTracker(**settings)
    first = PassRateTracker(**settings)
    a = [step(whole, i) for i in range(200)]
    b = [step(first, i) for i in range(113)]
    resumed = PassRateTracker(**settings)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    b += [step(resumed, i) for i in range(113, 200)]
    assert sum(a) > 10 and not all(a)  # both draws and skips
    assert b == a


def test_skip_prob_is_validated():
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="skip_prob"):
            PassRateTracker(skip_prob=bad)


GROUPS = st.lists(
    st.tuples(st.sampled_from("abc"), st.sampled_from([FAIL, PASS, MIXED]), st.integers(0, 3)),
    max_size=30,
)


@settings(max_examples=50, deadline=None)
@given(GROUPS)
def test_skip_prob_one_is_the_hard_band_and_zero_never_skips(events):
    # Whatever the history: s = 1 decides exactly as the default tracker, s = 0 never skips.
    hard, one, zero = (
        PassRateTracker(),
        PassRateTracker(skip_prob=1.0),
        PassRateTracker(skip_prob=0),
    )
    for pid, rewards, draws in events:
        for t in (hard, one, zero):
            t.update(pid, rewards)
        for _ in range(draws):
            assert one.should_draw(pid) == hard.should_draw(pid)
            assert zero.should_draw(pid)[0]
