"""The self-tuning staleness bound (schedule.auto_lag): driven by a scripted ESS."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slipstream.config import ConfigError, load_config
from slipstream.schedule.auto_lag import AutoLag, AutoLagRule, LagControl, lag_control

RULE = AutoLagRule(k_min=0, k_max=8, ess_target=0.8, margin=0.03, wait_min=0.05, patience=2)


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
    rule = AutoLagRule(k_min=0, k_max=16, ess_target=0.8, margin=0.0, patience=1)
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
    rule = AutoLagRule(k_min=0, k_max=8, ess_target=0.8, margin=0.0, patience=2)
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
    rule = AutoLagRule(k_max=8, kl_limit=0.05, patience=1)
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
    rule = AutoLagRule(k_min=0, k_max=8, ess_target=0.8, margin=margin, patience=patience)
    auto = AutoLag(rule, k=start)
    ks = drive(auto, lambda k: top - slope * k, 200)
    assert len(auto.changes) <= 2 * rule.k_max + 1
    assert len(set(ks[-50:])) == 1
    assert sum(1 for c in auto.changes if c[2] == "ess_low") <= 4


def test_lag_control_logs_every_change_and_the_watchdog_tighten():
    ctl = LagControl(AutoLag(AutoLagRule(k_max=4, patience=1), k=1), fixed_k=0)
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
    ctl = LagControl(AutoLag(AutoLagRule(k_max=4, patience=1), k=1), fixed_k=0)
    for _ in range(3):
        ctl({"staleness/ess_token": 0.99, "runtime/trainer_wait": 0.5})
    ctl.tighten(2, {})
    other = LagControl(AutoLag(AutoLagRule(k_max=4, patience=1), k=1), fixed_k=0)
    other.load_state_dict(ctl.state_dict())
    assert other.state_dict() == ctl.state_dict() and other.auto.k == 4


def test_a_restored_controller_decides_as_the_unbroken_one():
    """The checkpoint holds the windows measured under the current K and their averages:
    restored after one window of a patience of 2, the controller changes K at the next
    window, as the unbroken one does (it waited `patience` windows more, on averages
    restarted from nothing, and numbered its windows from 0 again)."""
    rule = AutoLagRule(k_max=8, patience=2)
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
    ctl = LagControl(AutoLag(AutoLagRule(k_max=8, patience=2), k=1), fixed_k=0)
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
    ctl = LagControl(AutoLag(AutoLagRule(k_max=8, patience=1), k=1), fixed_k=0)
    while ctl.current < 8:
        ctl(dict(rec))
    other = LagControl(AutoLag(AutoLagRule(k_max=4, patience=1), k=1), fixed_k=0)
    other.load_state_dict(json.loads(json.dumps(ctl.state_dict())))
    assert other.current == other.auto.k == other.auto.ceiling == 4
    assert all(other(dict(rec)) <= 4 for _ in range(5))
    fixed = LagControl(None, fixed_k=2)
    fixed.load_state_dict(LagControl(None, fixed_k=4).state_dict())
    assert fixed.current == 2 and fixed(dict(rec)) == 2
