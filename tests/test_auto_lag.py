"""The self-tuning staleness bound (schedule.auto_lag): driven by a scripted ESS."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.config import ConfigError, load_config
from slipstream.schedule.auto_lag import AutoLag, AutoLagRule, LagControl, lag_control

RULE = AutoLagRule(
    min_gain=0.0, k_min=0, k_max=8, ess_target=0.8, margin=0.03, wait_min=0.05, patience=2
)


def drive(auto: AutoLag, ess_of_k, windows: int, wait: float = 0.3, kl: float = 0.0) -> list[int]:
    """K after each of `windows` windows, with the ESS a function of the K the data had."""
    ks = []
    for _ in range(windows):
        auto.observe(ess_of_k(auto.k), kl, wait)
        ks.append(auto.k)
    return ks


def test_climbs_to_the_largest_k_above_the_band_and_stays():
    # ESS(K) = 1 - 0.04 K. The slow start doubles while the ESS is above the band
    # (>= 0.83): 1 -> 2 (0.92) -> 4 (0.84) -> 8; 0.68 at K=8 is below the target, so K is
    # halved to 4 and the ceiling becomes 7; then +1 steps: 4 -> 5, where 0.80 is inside the
    # band [0.80, 0.83): hold. So K settles at 5, after 5 changes.
    auto = AutoLag(RULE, k=1)
    ks = drive(auto, lambda k: 1 - 0.04 * k, 300)
    assert ks[-1] == 5 and auto.ceiling == 7
    assert [(k, why) for _, k, why in auto.changes] == [
        (2, "trainer_waits"),
        (4, "trainer_waits"),
        (8, "trainer_waits"),
        (4, "ess_low"),
        (5, "trainer_waits"),
    ]
    assert len(set(ks[20:])) == 1  # constant conditions: no change after it settled


def test_after_the_first_decrease_increases_are_additive():
    rule = AutoLagRule(min_gain=0.0, k_min=0, k_max=16, ess_target=0.8, margin=0.0, patience=1)
    auto = AutoLag(rule, k=1)
    ks = drive(auto, lambda k: 0.9 if k <= 9 else 0.7, 200)
    down = ks.index(16) + 1  # doubled 1 -> 2 -> 4 -> 8 -> 16, which is below the target
    assert ks[:down] == [2, 4, 8, 16] and ks[down] == 8
    assert all(b - a in (0, 1) for a, b in itertools.pairwise(ks[down:]) if b > a)
    assert ks[-1] == 9 and auto.ceiling == 9  # 10 was tried once (from 9 + 1), then left


def test_a_k_below_target_is_left_once_and_never_reentered():
    # ESS 0.9 up to K=5, 0.7 beyond: the slow start reaches K=8 (1 -> 2 -> 4 -> 8; 0.7 <
    # 0.8), is halved to 4 (ceiling 7), climbs 4 -> 5 -> 6 (0.7), is halved to 3 (ceiling 5),
    # climbs 3 -> 4 -> 5 and holds: K=6 and above are never tried again.
    rule = AutoLagRule(min_gain=0.0, k_min=0, k_max=8, ess_target=0.8, margin=0.0, patience=2)
    auto = AutoLag(rule, k=1)
    ks = drive(auto, lambda k: 0.9 if k <= 5 else 0.7, 400)
    assert ks.count(6) == 2 and ks.count(8) == 2  # patience windows under each, then down
    assert auto.ceiling == 5 and ks[-1] == 5
    assert len(set(ks[40:])) == 1
    assert [c[2] for c in auto.changes].count("ess_low") == 2


def test_holds_while_the_trainer_does_not_wait():
    auto = AutoLag(RULE, k=2)
    assert set(drive(auto, lambda k: 1.0, 100, wait=0.0)) == {2}


def test_kl_above_limit_lowers_k():
    rule = AutoLagRule(min_gain=0.0, k_max=8, kl_limit=0.05, patience=1)
    auto = AutoLag(rule, k=8)
    auto.observe(0.99, 0.2, 0.5)
    assert auto.k == 4 and auto.changes[-1][2] == "kl_high" and auto.ceiling == 7


@settings(max_examples=60, deadline=None)
@given(
    slope=st.floats(0.0, 0.2),
    top=st.floats(0.5, 1.0),
    start=st.integers(0, 8),
    patience=st.integers(1, 4),
    margin=st.floats(0.0, 0.1),
)
def test_no_oscillation_under_constant_conditions(slope, top, start, patience, margin):
    # Any ESS non-increasing in K, a trainer that always waits: a finite number of changes
    # (at most one decrease, since the ceiling is then a K with ESS >= target), then K is fixed.
    rule = AutoLagRule(
        min_gain=0.0, k_min=0, k_max=8, ess_target=0.8, margin=margin, patience=patience
    )
    auto = AutoLag(rule, k=start)
    ks = drive(auto, lambda k: top - slope * k, 200)
    assert len(auto.changes) <= 2 * rule.k_max + 1
    assert len(set(ks[-50:])) == 1
    assert sum(1 for c in auto.changes if c[2] == "ess_low") <= 4


def test_lag_control_logs_every_change_and_the_watchdog_tighten():
    ctl = LagControl(AutoLag(AutoLagRule(min_gain=0.0, k_max=4, patience=1), k=1), fixed_k=0)
    rec = {"staleness/ess_token": 0.99, "runtime/trainer_wait": 0.5}
    assert ctl(dict(rec)) == 2
    r = dict(rec)
    ctl(r)
    assert r["schedule/max_lag"] == 4 and r["schedule/max_lag_reason"] == "trainer_waits"  # 2K
    ctl.tighten(2, r)  # the watchdog, on the step record still open: the next window K = 0
    assert r["schedule/max_lag"] == 0 and r["schedule/max_lag_reason"] == "watchdog_tighten"
    assert ctl.current == 0
    r = dict(rec)
    assert ctl(r) == 0 and "schedule/max_lag_reason" not in r  # 2 windows under K = 0
    r = dict(rec)
    assert ctl(r) > 0 and r["schedule/max_lag_reason"] == "tighten_over"


def test_config():
    cfg = load_config(None, ['schedule.name="pipeline"', 'schedule.max_lag="auto"'])
    ctl = lag_control(cfg, cfg.schedule.lag_bound)
    assert ctl is not None and ctl.current == 1 and cfg.schedule.lag_bound == 8
    assert lag_control(load_config(None, ['schedule.name="pipeline"']), 4) is None
    with pytest.raises(ConfigError, match=r"schedule\.max_lag"):
        load_config(None, ['schedule.max_lag="auto"'])  # sync
    with pytest.raises(ConfigError, match=r"schedule\.max_lag_min"):
        load_config(
            None, ['schedule.name="async"', "schedule.max_lag_min=5", "schedule.max_lag_max=2"]
        )


def test_lag_control_state_round_trip():
    ctl = LagControl(AutoLag(AutoLagRule(min_gain=0.0, k_max=4, patience=1), k=1), fixed_k=0)
    for _ in range(3):
        ctl({"staleness/ess_token": 0.99, "runtime/trainer_wait": 0.5})
    ctl.tighten(2, {})
    other = LagControl(AutoLag(AutoLagRule(min_gain=0.0, k_max=4, patience=1), k=1), fixed_k=0)
    other.load_state_dict(ctl.state_dict())
    assert other.state_dict() == ctl.state_dict() and other.auto.k == 4


def test_a_restored_controller_decides_as_the_unbroken_one():
    """The checkpoint holds the windows measured under the current K and their averages:
    restored after one window of a patience of 2, the controller changes K at the next
    window, as the unbroken one does (it waited `patience` windows more, on averages
    restarted from nothing, and numbered its windows from 0 again)."""
    rule = AutoLagRule(min_gain=0.0, k_max=8, patience=2)
    ctl = LagControl(AutoLag(rule, k=1), fixed_k=0)
    rec = {"staleness/ess_token": 0.99, "runtime/trainer_wait": 0.5}
    ctl({**rec, "staleness/ess_token": 0.95})
    other = LagControl(AutoLag(rule, k=1), fixed_k=0)
    other.load_state_dict(json.loads(json.dumps(ctl.state_dict())))  # as a checkpoint holds it
    assert [ctl(dict(rec)) for _ in range(3)] == [other(dict(rec)) for _ in range(3)]
    assert ctl.auto.ess == other.auto.ess and ctl.auto.changes == other.auto.changes


def test_windows_under_the_watchdog_s_k0_do_not_move_the_controller():
    """While the watchdog holds K = 0, the windows are trained under K = 0, not under the
    controller's K: they must not count as its measurements. Their ESS is high and the
    trainer waits, so counting them doubled K at every `patience` windows (1 -> 8 within a
    10-window tighten) and the run came out of the tighten at K = 8, right after an alarm."""
    ctl = LagControl(AutoLag(AutoLagRule(min_gain=0.0, k_max=8, patience=2), k=1), fixed_k=0)
    rec = {"staleness/ess_token": 0.99, "runtime/trainer_wait": 0.5}
    ctl.tighten(10, {})
    ks = [ctl(dict(rec)) for _ in range(10)]
    assert ks == [0] * 9 + [1] and ctl.auto.k == 1 and ctl.auto.changes == []


def test_a_run_resumed_with_other_bounds_keeps_k_within_them():
    """A run may be resumed with other settings (`slipstream train --resume DIR key=value`):
    restored into `max_lag_max = 4`, a controller checkpointed at K = 8 goes on at 4 (it went
    on at 8, outside the bounds the queues and the samplers' abort rule were now sized for),
    and a fixed K with the watchdog's tighten goes on at the configured K, not the old one."""
    rec = {"staleness/ess_token": 0.99, "runtime/trainer_wait": 0.5}
    ctl = LagControl(AutoLag(AutoLagRule(min_gain=0.0, k_max=8, patience=1), k=1), fixed_k=0)
    while ctl.current < 8:
        ctl(dict(rec))
    other = LagControl(AutoLag(AutoLagRule(min_gain=0.0, k_max=4, patience=1), k=1), fixed_k=0)
    other.load_state_dict(json.loads(json.dumps(ctl.state_dict())))
    assert other.current == other.auto.k == other.auto.ceiling == 4
    assert all(other(dict(rec)) <= 4 for _ in range(5))
    fixed = LagControl(None, fixed_k=2)
    fixed.load_state_dict(LagControl(None, fixed_k=4).state_dict())
    assert fixed.current == 2 and fixed(dict(rec)) == 2


# ---- the throughput probe (min_gain > 0): a raise is kept only if it sped the trainer ----
GAIN = AutoLagRule(k_min=0, k_max=8, ess_target=0.8, patience=2, min_gain=0.1, probe=4)


def drive_waits(auto: AutoLag, wait_of_k, windows: int, ess: float = 0.99) -> list[int]:
    """K after each window, with the trainer's wait seconds per window (1 s of training) a
    function of the K the window ran under."""
    ks = []
    for _ in range(windows):
        w = wait_of_k(auto.k)
        auto.observe(ess, 0.0, w / (w + 1.0), wait_s=w, train_s=1.0)
        ks.append(auto.k)
    return ks


def test_a_raise_that_buys_no_speed_ends_the_climb_and_k_holds():
    # The agentic task's case: the samplers are the bottleneck, the trainer waits 1 s a window
    # whatever K is. K = 2 is tried for `probe` windows and gains nothing: the climb ends
    # there (the ceiling), and K stays at 2; it does not go back to 1, since only staleness
    # (ESS, KL) lowers K, and K = 2's ESS is above the target.
    auto = AutoLag(GAIN, k=1)
    ks = drive_waits(auto, lambda k: 1.0, 200)
    assert [(k, why) for _, k, why in auto.changes] == [(2, "trainer_waits"), (2, "no_gain")]
    assert auto.ceiling == 2 and set(ks[GAIN.probe :]) == {2}


def test_raises_continue_while_each_buys_speed_and_stop_at_the_first_that_does_not():
    # The built-in task's case: K = 2 cuts the wait from 1.0 to 0.3 s (train share 0.50 ->
    # 0.77, +54 %), K = 4 to 0.28 (+1.5 %: under the 10 % asked): no raise past 4, and 4 stays.
    waits = {1: 1.0, 2: 0.3, 4: 0.28, 8: 0.27}
    auto = AutoLag(GAIN, k=1)
    ks = drive_waits(auto, lambda k: waits[k], 200)
    assert [(k, why) for _, k, why in auto.changes] == [
        (2, "trainer_waits"),
        (4, "trainer_waits"),
        (4, "no_gain"),
    ]
    assert auto.ceiling == 4 and set(ks[2 * GAIN.probe :]) == {4}


def test_after_a_no_gain_only_staleness_lowers_k():
    # the climb ended at 2; later the ESS falls below the target: halved to 1 (ess_low), and
    # with the ceiling at 1 it is not raised again however long the trainer waits
    auto = AutoLag(GAIN, k=1)
    drive_waits(auto, lambda k: 1.0, 3 * GAIN.probe)
    assert auto.k == auto.ceiling == 2
    drive_waits(auto, lambda k: 1.0, 1, ess=0.5)  # the average falls to 0.745, below 0.8
    assert auto.k == 2  # but one window of the last three is not `patience` (2) of them
    drive_waits(auto, lambda k: 1.0, 1, ess=0.5)
    assert auto.k == 1 and auto.changes[-1][1:] == (1, "ess_low")
    assert set(drive_waits(auto, lambda k: 1.0, 50)) == {1}


def test_with_every_raise_paying_it_climbs_as_the_rule_without_the_probe():
    # the wait halves with each doubling: every raise is kept, K reaches the ceiling; raises
    # come `probe` windows apart (the before and after of each comparison)
    auto = AutoLag(GAIN, k=1)
    ks = drive_waits(auto, lambda k: 4.0 / k, 100)
    assert [k for _, k, _ in auto.changes] == [2, 4, 8] and ks[-1] == 8
    windows = [w for w, _, _ in auto.changes]
    assert windows == [4, 8, 12]


def test_an_ess_drop_during_the_probe_wins_over_it():
    # K = 2 is below the target: halved at once (after `patience`), not after the probe
    auto = AutoLag(GAIN, k=1)
    for _ in range(GAIN.probe):
        auto.observe(0.99, 0.0, 0.5, wait_s=1.0, train_s=1.0)
    assert auto.k == 2 and auto.before is not None
    for _ in range(GAIN.patience):
        auto.observe(0.5, 0.0, 0.5, wait_s=0.1, train_s=1.0)
    assert auto.k == 1 and auto.changes[-1][2] == "ess_low" and auto.before is None


@settings(max_examples=60, deadline=None)
@given(
    waits=st.lists(st.floats(0.0, 3.0), min_size=9, max_size=9),
    noise=st.floats(0.0, 0.5),
    slope=st.floats(0.0, 0.1),
    start=st.integers(0, 8),
    seed=st.integers(0, 10**6),
)
def test_the_probe_never_oscillates(waits, noise, slope, start, seed):
    # Any wait per K, noisy windows (each wait scaled by up to 1 +- noise), an ESS falling
    # with K: the ceiling only goes down, so the changes are finite and K settles.
    rng = random.Random(seed)
    auto = AutoLag(GAIN, k=start)
    ks = []
    for _ in range(600):
        w = waits[auto.k] * (1 + noise * (2 * rng.random() - 1))
        auto.observe(1.0 - slope * auto.k, 0.0, w / (w + 1), wait_s=w, train_s=1.0)
        ks.append(auto.k)
    assert len(auto.changes) <= 3 * GAIN.k_max
    assert len(set(ks[-100:])) == 1


def test_a_controller_restored_mid_probe_decides_as_the_unbroken_one():
    rec = {"staleness/ess_token": 0.99, "runtime/trainer_wait": 0.5, "step_time_s": 2.0}
    rec["time/train_s"] = 1.0
    ctl = LagControl(AutoLag(GAIN, k=1), fixed_k=0)
    for _ in range(GAIN.probe + 1):  # the raise to 2, and one window of its probe
        ctl(dict(rec))
    assert ctl.auto.before is not None
    other = LagControl(AutoLag(GAIN, k=1), fixed_k=0)
    other.load_state_dict(json.loads(json.dumps(ctl.state_dict())))
    assert [ctl(dict(rec)) for _ in range(8)] == [other(dict(rec)) for _ in range(8)]
    assert ctl.auto.changes == other.auto.changes
    assert [c[2] for c in ctl.auto.changes] == ["trainer_waits", "no_gain"]


def test_lag_control_reads_the_wait_and_train_seconds_of_the_step_record():
    # the same wait share (0.5) at every K, but the seconds say K = 2 halved the wait: kept
    ctl = LagControl(AutoLag(GAIN, k=1), fixed_k=0)
    for _ in range(GAIN.probe):
        ctl({"staleness/ess_token": 0.99, "runtime/trainer_wait": 0.5, "step_time_s": 2.0,
             "time/train_s": 1.0})  # fmt: skip
    assert ctl.current == 2
    for _ in range(GAIN.probe):
        ctl({"staleness/ess_token": 0.99, "runtime/trainer_wait": 0.2, "step_time_s": 1.25,
             "time/train_s": 1.0})  # fmt: skip
    assert ctl.current == 4 and [c[2] for c in ctl.auto.changes] == ["trainer_waits"] * 2


def test_one_outlier_window_does_not_lower_k():
    """Stop 55's agentic run (seed 14): at K = 1 one window's token ESS fell to 0.533 (one
    larger update; every other window 0.996-1.000), the average to 0.766, and K went to 0 for
    the rest of the run (the ceiling then 0): a synchronous run. A decrease now needs the ESS
    below the target in `patience` of the last `patience + 1` windows; a drop that lasts still
    lowers K one window later than before."""
    rule = AutoLagRule(min_gain=0.0, k_min=0, k_max=8, ess_target=0.8, margin=0.03, patience=2)
    auto = AutoLag(rule, k=1)
    for ess in (1.0, 0.998, 0.999, 0.996, 1.0, 0.999, 0.533, 0.999, 0.998):
        auto.observe(ess, 0.0, 0.0)  # (no wait: K is not raised either)
    assert auto.k == 1 and auto.ceiling == 8 and auto.changes == []
    auto.observe(0.533, 0.0, 0.0)
    auto.observe(0.6, 0.0, 0.0)  # two low windows of the last three: lowered
    assert auto.k == 0 and auto.changes[-1][2] == "ess_low"
    kl_rule = AutoLagRule(min_gain=0.0, k_max=8, kl_limit=0.05, patience=2)
    auto = AutoLag(kl_rule, k=4)
    for kl in (0.01, 0.01, 0.3, 0.01):  # the average passes 0.05 once, on one window
        auto.observe(0.99, kl, 0.0)
    assert auto.k == 4
    auto.observe(0.99, 0.3, 0.0)  # two of the last three windows over the limit: lowered
    assert auto.k == 2 and auto.changes[-1][2] == "kl_high"


# ---- stale drops (stale_share > 0): the bound throwing generated groups away ----
DROPS = AutoLagRule(k_min=0, k_max=8, patience=2, min_gain=0.1, probe=4, stale_share=0.05)


def drive_drops(auto: AutoLag, stale_of_k, windows: int, ess: float = 0.99) -> list[int]:
    """K after each window: the trainer waits 1 s a window whatever K is (no probe finds a
    gain) and the bound drops `stale_of_k(K)` of the generated groups."""
    ks = []
    for _ in range(windows):
        auto.observe(ess, 0.0, 0.5, wait_s=1.0, train_s=1.0, stale=stale_of_k(auto.k))
        ks.append(auto.k)
    return ks


def test_stale_drops_raise_k_without_a_probe_and_the_probe_takes_over_where_they_stop():
    # The built-in task's shares (stop 55's fixed-K runs, group counts): 8 % of the groups
    # dropped at K = 1, 9 % at K = 2, 2 % at K = 4, none at 8. The first two raises come
    # `patience` (2) windows apart, not `probe` (4); at K = 4 the drops are under 5 %, so the
    # raise to 8 is a probe again, which finds no gain: the climb ends at 8, which holds.
    shares = {1: 0.08, 2: 0.09, 4: 0.02, 8: 0.0}
    auto = AutoLag(DROPS, k=1)
    ks = drive_drops(auto, lambda k: shares[k], 100)
    assert auto.changes == [
        (2, 2, "stale_drops"),
        (4, 4, "stale_drops"),
        (8, 8, "trainer_waits"),
        (12, 8, "no_gain"),
    ]
    assert auto.ceiling == 8 and set(ks[12:]) == {8}
    off = AutoLag(replace(DROPS, stale_share=0.0), k=1)  # off: every raise is a probe
    drive_drops(off, lambda k: shares[k], 100)
    assert off.changes == [(4, 2, "trainer_waits"), (8, 2, "no_gain")]


def test_one_window_of_drops_is_not_evidence():
    auto = AutoLag(DROPS, k=1)
    for stale in (0.0, 0.3, 0.0):  # the average 0.075 is past 5 %, one window of three is
        auto.observe(0.99, 0.0, 0.5, wait_s=1.0, train_s=1.0, stale=stale)
    assert auto.k == 1
    auto.observe(0.99, 0.0, 0.5, wait_s=1.0, train_s=1.0, stale=0.3)  # two of the last three
    assert auto.changes == [(4, 2, "stale_drops")]


def test_drops_raise_k_during_a_probe_but_never_past_staleness_or_the_ceiling():
    auto = AutoLag(DROPS, k=1)
    drive_drops(auto, lambda k: 0.0, DROPS.probe)  # a probe: K = 2 on probation
    assert auto.k == 2 and auto.before is not None
    drive_drops(auto, lambda k: 0.2, 2)  # K = 2 drops a fifth of the groups: raised at once
    assert auto.k == 4 and auto.before is None and auto.changes[-1][2] == "stale_drops"
    drive_drops(auto, lambda k: 0.2, 2, ess=0.5)  # too stale: lowered, the drops notwithstanding
    assert auto.k == 2 and auto.ceiling == 3 and auto.changes[-1][2] == "ess_low"
    assert max(drive_drops(auto, lambda k: 0.2, 50)) == 3  # +1 steps after a decrease, to 3


@settings(max_examples=60, deadline=None)
@given(
    drop0=st.floats(0.0, 0.5),
    drop_slope=st.floats(0.0, 0.2),
    noise=st.floats(0.0, 0.05),
    slope=st.floats(0.0, 0.1),
    start=st.integers(0, 8),
    seed=st.integers(0, 10**6),
)
def test_drops_never_make_it_oscillate(drop0, drop_slope, noise, slope, start, seed):
    # drops falling with K (a looser bound drops fewer groups), noisy windows, an ESS falling
    # with K: the changes are finite and K settles
    rng = random.Random(seed)
    auto = AutoLag(DROPS, k=start)
    ks = []
    for _ in range(600):
        stale = max(0.0, drop0 - drop_slope * auto.k + noise * (2 * rng.random() - 1))
        auto.observe(1.0 - slope * auto.k, 0.0, 0.5, wait_s=1.0, train_s=1.0, stale=stale)
        ks.append(auto.k)
    assert len(auto.changes) <= 3 * DROPS.k_max
    assert len(set(ks[-100:])) == 1


def test_lag_control_reads_the_drops_from_the_ledger_counts_of_the_records():
    """The records carry the run's ledger counts; the share is of the window's new groups:
    50 generated, 4 stale and 1 aborted (10 %), then 40 with 1 stale (2.5 %)."""
    ctl = LagControl(AutoLag(DROPS, k=1), fixed_k=0)
    rec = {"staleness/ess_token": 0.99, "runtime/trainer_wait": 0.5}
    ctl({**rec, "ledger/generated": 50, "ledger/stale": 4, "ledger/aborted": 1})
    assert ctl.auto.recent[-1][2] == pytest.approx(0.1)
    state = json.loads(json.dumps(ctl.state_dict()))
    ctl({**rec, "ledger/generated": 90, "ledger/stale": 5, "ledger/aborted": 1})
    assert ctl.auto.recent[-1][2] == pytest.approx(0.025)
    other = LagControl(AutoLag(DROPS, k=1), fixed_k=0)  # restored: the same window's share
    other.load_state_dict(state)
    other({**rec, "ledger/generated": 90, "ledger/stale": 5, "ledger/aborted": 1})
    assert other.state_dict() == ctl.state_dict()
    assert ctl({**rec}) == ctl.current  # a record without counts: no new groups, share 0
    assert ctl.auto.recent[-1][2] == 0.0
