"""Published figures set beside the simulator, each as a function with its assumptions.

Figures 1, 3 and 4 take the published numbers as inputs (the straggler lengths, the MTTF
points, the failure rate and recovery times): they are consistency checks of the model, not
reproductions. Figure 2 is derived: the published ratios are only compared with it.
tests/test_sim_figures.py asserts them; bench/sim.py prints them.

1. Straggler tail, consistency check (Applied Compute: 40 problems x 32 samples on a 30B model, 99 % of samples
   done in 40 s, the last 1 % take 80 s more). Assumption: decode runs at a constant 10 ms a
   step whatever the batch (memory bound, weight reads dominate), so time is proportional to
   length: 4,000 tokens = 40 s, 12,000 = 120 s; training and weight sync take no time, so the
   figure isolates sampling. 8 engines of 160 slots hold the whole batch at once.
2. Pipeline vs sync on 128 H100s, long reasoning, derived (PipelineRL ~2x, VCPO 2.5x, AReaL 2-2.3x,
   ROLL Flash 2.2x). Assumptions: Qwen2.5-7B; DAPO's batch of 512 prompts x 16 samples, prompts
   of 512 tokens; lengths lognormal with median 5,000 tokens and log-sigma 0.6, cut at 16,384
   (mean ~5,900); H100 presets (decode at 70 % of HBM bandwidth + 3 ms a step, training at
   30 % MFU). `sync` is colocated (all 128 GPUs generate, then all train, as verl's hybrid
   engine); `pipeline` (max lag 4) runs 60 sampler GPUs and 68 trainer GPUs, the split the
   planner picks; a group older than the bound is kept and corrected (`lag_policy="keep"`,
   as the published systems do), not dropped as slipstream's trainer does by default. The
   ratio is of trained tokens per second, not time to equal quality.
3. MTTF = c / N, one c per source fitted to its published points (failures.py): consistency.
4. Goodput at one failure a day (a 50-day run on 4,000 GPUs): manual vs automated recovery,
   from the published failure rate and recovery times: consistency.
"""

from __future__ import annotations

from dataclasses import replace

from slipstream.schedule.presets import preset
from slipstream.sim.cost import model_shape
from slipstream.sim.failures import (
    RECOVERY,
    SOURCES,
    fit_reliability_constant,
    goodput,
    simulate_goodput,
)
from slipstream.sim.hardware import hardware
from slipstream.sim.lengths import Lognormal, Straggler
from slipstream.sim.simulator import Cluster, SimConfig, SimResult, Workload, simulate

# A device whose decode step takes 10 ms whatever it holds, and everything else no time.
FLAT_10MS = replace(
    hardware("h100"),
    name="flat-10ms",
    peak_flops=1e30,
    hbm_bandwidth=1e30,
    interconnect_bandwidth=1e30,
    local_bandwidth=1e30,
    decode_overhead_s=0.01,
    train_overhead_s=0.0,
    sync_latency_s=0.0,
)


def straggler_figure(steps: int = 12, seed: int = 0) -> dict[str, float]:
    """Sync step time, how much of it waits on the last 1 %, and what pipelining recovers."""
    model = model_shape("qwen3-30b-a3b")
    lengths = Straggler(p99=4000, tail_max=12000)
    work = Workload(batch_prompts=40, group_size=32, lengths=lengths, prompt_len=0)
    sync = simulate(
        SimConfig(
            Cluster(FLAT_10MS, model, 8, None, tp=1, slots=160), work, preset("sync"), steps, seed
        )
    )
    pipe = simulate(
        SimConfig(
            Cluster(FLAT_10MS, model, 9, 8, tp=1, slots=160),
            work,
            preset("pipeline"),
            steps,
            seed,
            lag_policy="keep",
        )
    )
    step = float(sync.step_times_s.mean())
    p99_s = lengths.p99 * FLAT_10MS.decode_overhead_s
    return {
        "sync_step_s": step,
        "p99_s": p99_s,
        "tail_wait_frac": (step - p99_s) / step,
        "sync_sampler_util": sync.sampler_slot_util,
        "pipeline_sampler_util": pipe.sampler_slot_util,
        "pipeline_step_s": float(pipe.step_times_s.mean()),
        "speedup": pipe.throughput_tokens_s / sync.throughput_tokens_s,
        "pipeline_lag_max": float(pipe.lag_max),
    }


def long_reasoning_workload() -> Workload:
    return Workload(512, 16, Lognormal(median=5000, sigma=0.6, max_len=16384), prompt_len=512)


def pipeline_vs_sync_runs(
    sampler_gpus: int = 60, steps: int = 10, seed: int = 0
) -> tuple[SimResult, SimResult]:
    """(sync colocated, pipeline) on 128 H100s under the module's stated assumptions."""
    hw, model, work = hardware("h100"), model_shape("7b"), long_reasoning_workload()
    sync = simulate(SimConfig(Cluster(hw, model, 128), work, preset("sync"), steps, seed))
    pipe_cluster = Cluster(hw, model, 128, sampler_gpus)
    pipe_cfg = SimConfig(pipe_cluster, work, preset("pipeline", 4), steps, seed, lag_policy="keep")
    pipe = simulate(pipe_cfg)
    return sync, pipe


def pipeline_vs_sync_figure(steps: int = 10, seed: int = 0) -> dict[str, float]:
    sync, pipe = pipeline_vs_sync_runs(steps=steps, seed=seed)
    return {
        "speedup": pipe.throughput_tokens_s / sync.throughput_tokens_s,
        "sync_step_s": float(sync.step_times_s.mean()),
        "pipeline_step_s": float(pipe.step_times_s.mean()),
        "sync_sampler_idle": 1 - sync.sampler_busy_frac,
        "pipeline_sampler_idle": 1 - pipe.sampler_busy_frac,
        "pipeline_trainer_idle": 1 - pipe.trainer_busy_frac,
        "pipeline_lag_mean": pipe.lag_mean,
        "pipeline_token_lag_mean": pipe.token_lag_mean,
    }


def mttf_figure() -> dict[str, dict[str, float]]:
    """Per source: the fitted c (GPU-hours) and the relative error at each published point."""
    out = {}
    for name, src in SOURCES.items():
        c = fit_reliability_constant(src.points)
        row = {"c_gpu_hours": c}
        for n, mttf in src.points:
            row[f"err_at_{n}"] = (c / n) / mttf - 1
        out[name] = row
    return out


def goodput_figure(runs: int = 2000, seed: int = 0) -> dict[str, dict[str, float]]:
    """One failure a day over a 50-day run on 4,000 GPUs ($54M): goodput per strategy."""
    rate, window = 1 / 24, 50 * 24
    out = {}
    for name, rec in RECOVERY.items():
        sim = simulate_goodput(rate, rec, window, runs=runs, seed=seed)
        g = goodput(rate, rec)
        out[name] = {
            "recovery_h": rec.downtime_h,
            "goodput": g,
            "goodput_mc": sim.mean,
            "goodput_p10": sim.p10,
            "goodput_p90": sim.p90,
            "wasted_musd": (1 - g) * 54,
            "spares_musd": rec.spare_frac * 54,
        }
    return out
