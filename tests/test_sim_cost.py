"""Cost model, length distributions and failure arithmetic of slipstream.sim."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slipstream.model.llama import CausalLM, ModelConfig
from slipstream.sim.cost import (
    DecodeModel,
    ModelShape,
    engine_slots,
    kv_capacity_tokens,
    min_trainer_gpus,
    model_shape,
    prefill_time,
    sampler_tp,
    sum_max_linear,
    sum_max_linear_np,
    train_time,
    weight_sync_time,
)
from slipstream.sim.engine import share_times
from slipstream.sim.failures import (
    RECOVERY,
    Recovery,
    fit_reliability_constant,
    goodput,
    simulate_goodput,
)
from slipstream.sim.hardware import hardware
from slipstream.sim.lengths import (
    DEFAULT_MAX_LEN,
    Empirical,
    HeavyTail,
    Lognormal,
    Straggler,
    parse_lengths,
)

H100 = hardware("h100")
Q7B = model_shape("7b")

finite = st.floats(-10, 10, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(finite, finite, finite, finite, st.integers(0, 60))
@example(0.0, 0.0, 1.0, -2.225073858507e-311, 5)  # a subnormal slope: the root overflows
@example(0.0, 0.0, 1.0, 2.225073858507e-311, 5)
@example(1.0, 0.0, 0.0, 2.225073858507e-311, 5)
def test_sum_max_linear_matches_naive_sum(
    a1: float, b1: float, a2: float, b2: float, k: int
) -> None:
    naive = sum(max(a1 + b1 * x, a2 + b2 * x) for x in range(k))
    assert sum_max_linear(a1, b1, a2, b2, k) == pytest.approx(naive, rel=1e-9, abs=1e-9)
    one = [np.array([v]) for v in (a1, b1, a2, b2, k)]
    arr = sum_max_linear_np(one[0], one[1], one[2], one[3], one[4])
    assert arr[0] == pytest.approx(naive, rel=1e-9, abs=1e-9)


def test_sum_max_linear_equal_slopes() -> None:
    # Parallel lines: the upper one throughout. 3 steps of max(1 + x, 2 + x) = 2 + 3 + 4.
    assert sum_max_linear(1, 1, 2, 1, 3) == 9


def test_kv_bytes_and_weight_bytes_of_qwen_7b() -> None:
    # 2 (K and V) x 28 layers x 4 KV heads x 128 dims x 2 bytes.
    assert Q7B.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57344
    assert Q7B.weight_bytes == pytest.approx(15.2e9)


def test_model_info_records_the_element_size_and_old_files_keep_2_bytes() -> None:
    cfg = ModelConfig(
        vocab_size=13, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    model = CausalLM(cfg)
    info = model.info()  # what run.setup writes to model_info.json
    assert info["bytes_per_param"] == 4  # float32, as the CPU runs train
    assert info["params"] == sum(p.numel() for p in model.parameters())
    shape = ModelShape.from_info(info)
    assert shape.bytes_per_param == shape.kv_bytes_per_elem == 4.0
    assert shape.kv_bytes_per_token == 2 * 2 * 1 * 8 * 4
    assert model.to(torch.bfloat16).info()["bytes_per_param"] == 2
    # a model_info.json from before the key: 2 bytes, as its recorded runs were calibrated
    old = {k: v for k, v in info.items() if k != "bytes_per_param"}
    assert ModelShape.from_info(old).bytes_per_param == 2.0


def test_decode_step_golden_values() -> None:
    d = DecodeModel.build(Q7B, H100)
    # Batch 1, empty cache: memory bound, 15.2 GB at 70 % of 3.35 TB/s = 6.48 ms, + 3 ms.
    assert d.step_time(1, 0) == pytest.approx(3e-3 + 15.2e9 / (3.35e12 * 0.7), rel=1e-9)
    # 256 sequences of 4,000 tokens read 58.7 GB of KV cache on top of the weights.
    ctx = 256 * 4000
    expected = 3e-3 + (15.2e9 + 57344 * ctx) / (3.35e12 * 0.7)
    assert d.step_time(256, ctx) == pytest.approx(expected, rel=1e-9)


def test_small_batch_costs_about_what_batch_32_costs() -> None:
    # The weights dominate: why a straggler leaves its engine nearly idle at full step cost.
    d = DecodeModel.build(Q7B, H100)
    assert d.step_time(32, 32 * 1000) / d.step_time(1, 1000) < 1.1


def test_decode_turns_compute_bound_at_large_batch_without_kv() -> None:
    d = DecodeModel.build(Q7B, H100)
    n = 4096  # 2 x 7.6e9 x 4096 FLOPs at 50 % of 989 TFLOP/s = 126 ms > 6.5 ms of weights
    assert d.flop_seq * n > d.weights
    assert d.step_time(n, 0) == pytest.approx(3e-3 + 2 * 7.6e9 * n / (989e12 * 0.5), rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 300), st.integers(0, 10**6), st.integers(0, 400), st.floats(1e-4, 5.0))
def test_time_for_steps_and_its_inverse(n: int, ctx: int, k: int, dt: float) -> None:
    d = DecodeModel.build(Q7B, H100)
    naive = sum(d.step_time(n, ctx + n * i) for i in range(k))
    assert d.time_for_steps(n, ctx, k) == pytest.approx(naive, rel=1e-9, abs=1e-12)
    j = d.steps_within(n, ctx, dt, 400)
    assert j == 400 or d.time_for_steps(n, ctx, j) >= dt
    assert j == 0 or d.time_for_steps(n, ctx, j - 1) < dt


def test_prefill_train_sync_golden_values() -> None:
    # 512 tokens: 2 x 7.6e9 x 512 + attention 4 x 28 x 3584 x 512^2 / 2, at 60 % of peak.
    flops = 2 * 7.6e9 * 512 + 4 * 28 * 3584 * 512**2 / 2
    assert prefill_time(Q7B, H100, 512) == pytest.approx(flops / (989e12 * 0.6))
    # 1M tokens on 8 GPUs at 30 % MFU, + 2 s optimizer overhead.
    assert train_time(Q7B, H100, 1e6, 8) == pytest.approx(2 + 6 * 7.6e9 * 1e6 / (8 * 989e12 * 0.3))
    # 15.2 GB over 50 GB/s InfiniBand + 1 s; over 450 GB/s NVLink when colocated.
    assert weight_sync_time(Q7B, H100) == pytest.approx(1 + 15.2e9 / 50e9)
    assert weight_sync_time(Q7B, H100, colocated=True) == pytest.approx(1 + 15.2e9 / 450e9)


def test_memory_bounds() -> None:
    assert sampler_tp(Q7B, H100) == 1
    assert sampler_tp(model_shape("32b"), H100) == 2  # 65.6 GB > half of 72 GB
    # (80 GB x 0.85 - 15.2 GB) / 57,344 B = 920,759 tokens.
    assert kv_capacity_tokens(Q7B, H100, 1) == pytest.approx((80e9 * 0.85 - 15.2e9) / 57344)
    assert engine_slots(Q7B, H100, 1, 8000) == 115
    assert engine_slots(Q7B, H100, 1, 100) == 256  # capped by max_num_seqs
    assert min_trainer_gpus(Q7B, H100) == 2  # 16 B x 7.6e9 = 122 GB over 64 GB


def _naive_engine(
    d: DecodeModel, lengths: list[int], slots: int, prompt: float
) -> tuple[float, float]:
    """Step-by-step reference: FIFO queue, a freed slot refilled before the next step."""
    queue, t, seq_s = list(lengths), 0.0, 0.0
    active: list[list[int]] = []
    while queue or active:
        while queue and len(active) < slots:
            active.append([queue.pop(0), 0])
        dt = d.step_time(len(active), sum(prompt + a[1] for a in active))
        t, seq_s = t + dt, seq_s + len(active) * dt
        for a in active:
            a[1] += 1
        active = [a for a in active if a[1] < a[0]]
    return t, seq_s


@pytest.mark.parametrize("slots", [3, 64])
def test_share_times_matches_step_by_step_engine(slots: int) -> None:
    d = DecodeModel(3e-3, 1e-4, 2e-8, 4e-3, 3e-7)
    rng = np.random.default_rng(1)
    shares = [rng.integers(1, 80, size=n) for n in (1, 7, 20, 33)]
    dur, seq_s = share_times(d, 11.0, shares, slots)
    for i, lengths in enumerate(shares):
        t, s = _naive_engine(d, lengths.tolist(), slots, 11.0)
        assert dur[i] == pytest.approx(t, rel=1e-9)
        assert seq_s[i] == pytest.approx(s, rel=1e-9)


def test_straggler_distribution_is_exact() -> None:
    dist = Straggler(p99=4000, tail_max=12000)
    lengths, _ = dist.sample(np.random.default_rng(0), 40, 32)
    assert lengths.shape == (40, 32)
    assert lengths.max() == 12000
    assert (lengths > 4000).sum() == round(0.01 * 1280)
    assert (lengths <= 4000).mean() == pytest.approx(0.99, abs=0.002)


def test_lognormal_median_clip_and_group_correlation() -> None:
    dist = Lognormal(median=1000, sigma=0.8, max_len=4000, prompt_share=0.8)
    lengths, expected = dist.sample(np.random.default_rng(0), 4000, 8)
    assert np.median(lengths) == pytest.approx(1000, rel=0.05)
    assert lengths.max() == 4000 and lengths.min() >= 1
    # Most log-variance is between prompts: group means track the prediction.
    corr = np.corrcoef(np.log(lengths.mean(axis=1)), np.log(expected))[0, 1]
    assert corr > 0.7


def test_heavy_tail_has_heavier_tail() -> None:
    rng = np.random.default_rng(0)
    body, _ = Lognormal(1000, 0.5, 10**6).sample(rng, 2000, 8)
    heavy, _ = HeavyTail(1000, 0.5, 10**6, tail_frac=0.05, alpha=1.2).sample(rng, 2000, 8)
    assert np.quantile(heavy, 0.999) > 3 * np.quantile(body, 0.999)


def test_residual_mean_is_length_biased() -> None:
    # Constant lengths: a busy slot holds on average half a sequence.
    dist = Empirical([np.array([100, 100])])
    assert dist.mean == 100 and dist.residual_mean == 50


def test_empirical_resamples_whole_groups() -> None:
    dist = Empirical.from_steps([[1, 2, 3, 4, 5, 6], [7, 8, 9]], group_size=3)
    lengths, _ = dist.sample(np.random.default_rng(0), 50, 3)
    rows = {tuple(r) for r in lengths.tolist()}
    assert rows <= {(1, 2, 3), (4, 5, 6), (7, 8, 9)}


def test_parse_lengths() -> None:
    d = parse_lengths("lognormal:median=2000,sigma=0.7,max=16384")
    assert isinstance(d, Lognormal) and d.max_len == 16384
    assert isinstance(parse_lengths("heavy:median=800,sigma=0.6,max=9000,tail=0.1"), HeavyTail)
    assert isinstance(parse_lengths("straggler:p99=40,max=120"), Straggler)
    # without max, lognormal and heavy are cut at DEFAULT_MAX_LEN; straggler's is its tail's end
    assert parse_lengths("lognormal:median=5000,sigma=0.6") == Lognormal(5000, 0.6, 16384)
    assert parse_lengths("heavy:median=800,sigma=0.6").max_len == DEFAULT_MAX_LEN == 16384
    for bad, msg in [
        ("straggler:p99=40", "missing key max"),
        ("gamma:k=1", "kind must be"),
        ("lognormal:median=2000,max=10", "missing key sigma"),
        ("lognormal:median=x", "numbers"),
        ("lognormal:median=1,sigma=1,max=9,foo=1", "unknown key"),
        # out of range: one line naming the key (was a ZeroDivisionError for max, alpha)
        ("lognormal:median=200,sigma=0.5,max=0", "max must be >= 1, got 0"),
        ("heavy:median=200,sigma=0.5,max=1024,alpha=0", "alpha must be > 0, got 0"),
        ("lognormal:median=0,sigma=0.5", "median must be > 0, got 0"),
        ("lognormal:median=-5,sigma=0.5", "median must be > 0, got -5"),
        ("lognormal:median=inf,sigma=0.5", "median must be > 0, got inf"),
        ("lognormal:median=9,sigma=-1", "sigma must be >= 0"),
        ("lognormal:median=9,sigma=1,prompt_share=2", r"prompt_share must be in \[0, 1\]"),
        ("heavy:median=9,sigma=1,tail=-0.1", r"tail must be in \[0, 1\]"),
        ("straggler:p99=0,max=50", "p99 must be > 0"),
        ("straggler:p99=100,max=50", "p99 must be below max"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_lengths(bad)


def test_reliability_constant_is_log_space_least_squares() -> None:
    pts = ((10, 100.0), (1000, 4.0))  # N x MTTF = 1000 and 4000: geometric mean 2000
    assert fit_reliability_constant(pts) == pytest.approx(2000)


def test_goodput_formula_limits() -> None:
    rec = Recovery("x", downtime_h=1.0, checkpoint_interval_h=0.5, checkpoint_write_h=0.05)
    assert goodput(0.0, rec) == pytest.approx(0.5 / 0.55)  # only checkpoint writes cost
    # Rare failures: each costs R plus half an interval (plus the write share).
    rate = 1e-4
    approx = (1 / rate - 0.275) / (1 / rate + 1.0) * (0.5 / 0.55)
    assert goodput(rate, rec) == pytest.approx(approx, rel=1e-4)


def test_goodput_monte_carlo_agrees_with_formula() -> None:
    rec = RECOVERY["automated"]
    sim = simulate_goodput(1 / 24, rec, window_h=24 * 400, runs=64, seed=3)
    assert sim.mean == pytest.approx(goodput(1 / 24, rec), abs=0.003)
    assert sim.p10 <= sim.mean <= sim.p90
    assert sim.failures_mean == pytest.approx(400 * 24 / (24 + 0.75), rel=0.05)


def test_mttf_constant_bounds() -> None:
    assert math.isclose(fit_reliability_constant(((8, 1.0),)), 8.0)


def test_measure_cpu_replaces_only_the_cpu_presets_peaks():
    import dataclasses

    import torch

    from slipstream.sim.hardware import measure_cpu

    threads = torch.get_num_threads()
    try:
        hw = measure_cpu(threads=1, repeats=2)
    finally:
        torch.set_num_threads(threads)
    cpu = hardware("cpu")
    assert hw.peak_flops > 1e8 and hw.hbm_bandwidth > 1e8  # any machine that runs the tests
    assert (
        dataclasses.replace(hw, peak_flops=cpu.peak_flops, hbm_bandwidth=cpu.hbm_bandwidth) == cpu
    )
