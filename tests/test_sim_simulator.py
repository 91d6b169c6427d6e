"""The discrete-event cluster simulator: invariants, schedule semantics, failures, speed."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from slipstream.schedule.presets import PRESETS, preset
from slipstream.sim.cost import model_shape
from slipstream.sim.failures import FailureModel, Recovery
from slipstream.sim.hardware import hardware
from slipstream.sim.lengths import Lognormal
from slipstream.sim.simulator import Cluster, SimConfig, Workload, simulate

H100 = hardware("h100")
SMALL = model_shape("0.5b")
WORK = Workload(16, 4, Lognormal(median=300, sigma=0.8, max_len=2048), prompt_len=128)


def small(name: str, lag: int | None = None, **kw: Any) -> SimConfig:
    spec = preset(name, lag)
    colocated = spec.batching == "fixed" and spec.max_lag == 0
    cluster = Cluster(H100, SMALL, 16, None if colocated else 12)
    return replace(SimConfig(cluster, WORK, spec, steps=25, seed=1), **kw)


def _adds_up(groups: dict[str, int]) -> bool:
    ends = ("trained", "dropped_stale", "aborted", "lost_failure", "in_flight_end")
    return groups["admitted"] == sum(groups.get(k, 0) for k in ends)


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("policy", ["keep", "drop", "abort"])
def test_every_group_ends_in_exactly_one_place(name: str, policy: str) -> None:
    res = simulate(small(name, lag_policy=policy))
    assert _adds_up(res.groups), res.groups
    assert res.groups["trained"] == 25 * WORK.batch_prompts
    assert len(res.step_end_s) == 26 and np.all(np.diff(res.step_end_s) > 0)


@pytest.mark.parametrize("name", list(PRESETS))
def test_groups_add_up_through_failures(name: str) -> None:
    # A failure every ~30 s of a 16-GPU run: many job and engine failures in 25 steps.
    fail = FailureModel(c_gpu_hours=16 * 30 / 3600, recovery=Recovery("fast", 10 / 3600, 20 / 3600))
    res = simulate(small(name, lag=2 if name in ("async", "pipeline") else None, failures=fail))
    assert res.failures > 0
    assert _adds_up(res.groups), res.groups
    assert res.groups.get("lost_failure", 0) > 0
    assert 0 < res.goodput < 1


def test_sync_with_a_seed_is_deterministic() -> None:
    a, b = simulate(small("sync")), simulate(small("sync"))
    np.testing.assert_array_equal(a.step_end_s, b.step_end_s)
    assert simulate(small("sync", seed=2)).wall_s != a.wall_s


def test_lag_bounds_per_schedule() -> None:
    assert set(simulate(small("sync")).lag_counts) == {0}
    assert set(simulate(small("tail_batching")).lag_counts) == {0}
    assert set(simulate(small("double_buffer")).lag_counts) <= {0, 1}
    for name in ("async", "pipeline"):
        for policy in ("drop", "abort"):
            assert max(simulate(small(name, 2, lag_policy=policy)).lag_counts) <= 2


def test_in_flight_weights_make_later_tokens_fresher() -> None:
    pipe = simulate(small("pipeline", 4))
    assert pipe.token_lag_mean < pipe.sample_lag_token_mean
    # Weights between batches: every token of a sample has its sample's version.
    asyn = simulate(small("async", 4))
    assert asyn.token_lag_mean == pytest.approx(asyn.sample_lag_token_mean)


@pytest.mark.parametrize("name", ["async", "pipeline"])
@pytest.mark.parametrize("policy", ["keep", "drop", "abort"])
def test_drain_issues_only_what_the_steps_left_train(name: str, policy: str) -> None:
    """`drain` bounds the live groups by min(K + 1, steps left) x B, as the orchestrator does:
    the run ends with nothing in flight, and its last step, waiting for the slowest of the
    last groups with no new work to fill the slots, is slower than its steady steps. Without
    it, groups no step will train are still admitted and in flight at the end."""
    steady = simulate(small(name, 2, lag_policy=policy, steps=40))
    drained = simulate(small(name, 2, lag_policy=policy, steps=40, drain=True))
    assert _adds_up(drained.groups), drained.groups
    assert drained.groups["in_flight_end"] == 0 < steady.groups["in_flight_end"]
    assert drained.groups["admitted"] < steady.groups["admitted"]
    times = np.diff(drained.step_end_s)
    assert times[-1] > np.median(times[5:-3])


def test_pipeline_keeps_samplers_busier_than_sync_on_long_tails() -> None:
    sync = simulate(small("sync"))
    pipe = simulate(small("pipeline", 4))
    assert pipe.sampler_slot_util > 2 * sync.sampler_slot_util
    assert pipe.throughput_tokens_s > sync.throughput_tokens_s


def test_tail_batching_helps_when_lengths_are_predictable() -> None:
    predictable = Workload(
        16, 4, Lognormal(300, 1.0, 4096, prompt_share=0.9, predict_noise=0.05), 128
    )
    sync = simulate(small("sync", workload=predictable, steps=40))
    tail = simulate(small("tail_batching", workload=predictable, steps=40))
    assert tail.throughput_tokens_s > 1.1 * sync.throughput_tokens_s
    assert tail.step_times_s.std() > sync.step_times_s.std()  # short and long batches alternate


def test_tail_batching_pools_of_any_size() -> None:
    res = simulate(small("tail_batching", workload=replace(WORK, tail_pool=3)))
    assert _adds_up(res.groups) and res.groups["trained"] == 25 * WORK.batch_prompts


def test_colocated_overlap_is_rejected() -> None:
    cfg = SimConfig(Cluster(H100, SMALL, 16), WORK, preset("pipeline"), steps=5)
    with pytest.raises(ValueError, match="separate sampler and trainer"):
        simulate(cfg)
    with pytest.raises(ValueError, match="no trainer GPUs"):
        simulate(replace(cfg, cluster=Cluster(H100, SMALL, 16, 16)))


def test_summary_reports_what_users_ask_for() -> None:
    s = simulate(small("pipeline", 4)).summary()
    for key in (
        "throughput_tokens_s",
        "step_time_mean_s",
        "step_time_std_s",
        "step_time_p95_s",
        "sampler_idle_frac",
        "trainer_idle_frac",
        "lag_mean",
        "goodput",
        "cost_per_mtok",
    ):
        assert np.isfinite(s[key]), key
    assert 0 <= s["sampler_idle_frac"] <= 1 and 0 <= s["trainer_idle_frac"] <= 1
    assert s["step_time_p95_s"] >= s["step_time_p50_s"]


@pytest.mark.slow
def test_speed_128_gpus_1000_steps_under_10_s() -> None:
    work = Workload(64, 8, Lognormal(median=1500, sigma=0.6, max_len=8192), prompt_len=512)
    cluster = Cluster(H100, model_shape("7b"), 128, 96)
    cfg = SimConfig(cluster, work, preset("pipeline", 4), steps=1000)
    # CPU seconds of this process (the simulator is single-threaded Python): a bound on its
    # own cost that other jobs sharing the machine do not move, as they move wall time
    t0 = time.process_time()
    res = simulate(cfg)
    elapsed = time.process_time() - t0
    assert res.groups["trained"] == 64 * 1000
    assert elapsed < 10, f"{elapsed:.1f} CPU s"


def test_sim_command_minimum_agrees_with_the_simulator() -> None:
    """Consistency check: `slipstream sim --steps` is checked against `SIM_MIN_STEPS` before a
    SimConfig is built; that many steps at the default warm-up simulate, one fewer is refused."""
    from slipstream.sim.cli import SIM_MIN_STEPS

    simulate(small("sync", steps=SIM_MIN_STEPS))
    with pytest.raises(ValueError, match="must exceed warmup_steps"):
        simulate(small("sync", steps=SIM_MIN_STEPS - 1))
