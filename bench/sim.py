"""The simulator beside published figures, and its speed.

Sections 1, 3 and 4 are consistency checks (the published numbers are their inputs); section 2
(pipeline vs sync on 128 H100s) is the one derived result. The out-of-sample prediction of
measured runs on this machine is bench/sim_calibration.py.

Run: python bench/sim.py. Prints readable tables, then one JSON line of headline figures.
The assumptions behind each figure are in slipstream/sim/figures.py and failures.py.
"""

from __future__ import annotations

import json
import time

from slipstream.schedule.presets import preset
from slipstream.sim.cost import model_shape
from slipstream.sim.figures import (
    goodput_figure,
    long_reasoning_workload,
    mttf_figure,
    pipeline_vs_sync_figure,
    straggler_figure,
)
from slipstream.sim.hardware import hardware
from slipstream.sim.lengths import Lognormal
from slipstream.sim.planner import PlanRequest, balanced_split
from slipstream.sim.simulator import Cluster, SimConfig, Workload, simulate


def straggler() -> dict[str, float]:
    fig = straggler_figure()
    print("1. Straggler tail (consistency check: the 40 s / 80 s are inputs)")
    print(f"   sync step                          {fig['sync_step_s']:8.1f} s")
    print(f"   share of the step waiting on 1 %   {fig['tail_wait_frac']:8.1%}")
    print(f"   sync sampler utilisation           {fig['sync_sampler_util']:8.1%}")
    print(f"   pipeline sampler utilisation       {fig['pipeline_sampler_util']:8.1%}")
    print(f"   pipeline throughput / sync         {fig['speedup']:8.2f} x")
    print(f"   pipeline oldest-token lag, max     {fig['pipeline_lag_max']:8.0f}")
    return fig


def pipeline_vs_sync() -> dict[str, float]:
    fig = pipeline_vs_sync_figure()
    print(
        "\n2. Derived: pipeline vs sync, 128 H100, Qwen2.5-7B, 512 x 16, lengths lognormal(5000, 0.6) <= 16k"
    )
    print(f"   sync (colocated) step              {fig['sync_step_s']:8.1f} s")
    print(f"   pipeline (60 samplers, K=4) step   {fig['pipeline_step_s']:8.1f} s")
    print(f"   speedup                            {fig['speedup']:8.2f} x   (published 1.8-2.8 x)")
    print(f"   sync sampler idle                  {fig['sync_sampler_idle']:8.1%}")
    print(
        f"   pipeline sampler / trainer idle    {fig['pipeline_sampler_idle']:8.1%} / {fig['pipeline_trainer_idle']:.1%}"
    )
    print(
        f"   pipeline lag: sample / token mean  {fig['pipeline_lag_mean']:8.2f} / {fig['pipeline_token_lag_mean']:.2f}"
    )
    hw, model, work = hardware("h100"), model_shape("7b"), long_reasoning_workload()
    print(
        f"   balanced split from the cost model: {balanced_split(PlanRequest(128, hw, model, work))} sampler GPUs"
    )
    print("   sampler GPUs:   " + " ".join(f"{s:>5}" for s in range(48, 80, 4)))
    row = []
    for s in range(48, 80, 4):
        res = simulate(SimConfig(Cluster(hw, model, 128, s), work, preset("pipeline", 4), steps=8))
        row.append(res.throughput_tokens_s)
    base = simulate(
        SimConfig(Cluster(hw, model, 128), work, preset("sync"), steps=8)
    ).throughput_tokens_s
    print("   speedup:        " + " ".join(f"{t / base:5.2f}" for t in row))
    return fig


def mttf() -> dict[str, dict[str, float]]:
    fig = mttf_figure()
    print("\n3. MTTF = c / N, one c per source (consistency check: c is fitted to the points)")
    for name, row in fig.items():
        errs = ", ".join(
            f"{k.removeprefix('err_at_')} GPUs {v:+.1%}"
            for k, v in row.items()
            if k.startswith("err")
        )
        print(f"   {name:14} c = {row['c_gpu_hours']:9,.0f} GPU-h   fit: {errs}")
    return fig


def goodput_lines(fig: dict[str, dict[str, float]]) -> list[str]:
    """The goodput table: a header, then one row per strategy, column for column."""
    lines = [
        f"   {'strategy':12} {'recovery':>9} {'goodput':>8} {'MC mean':>8} {'p10-p90':>13} "
        f"{'wasted':>7} {'spares':>7}"
    ]
    for name, r in fig.items():
        p10_90 = f"{r['goodput_p10']:.1%}-{r['goodput_p90']:.1%}"
        lines.append(
            f"   {name:12} {r['recovery_h']:8.2f}h {r['goodput']:8.1%} {r['goodput_mc']:8.1%} "
            f"{p10_90:>13} {r['wasted_musd']:6.1f}M {r['spares_musd']:6.1f}M"
        )
    return lines


def goodput() -> dict[str, dict[str, float]]:
    fig = goodput_figure()
    print("\n4. Goodput, 1 failure/day, 50 days on 4,000 GPUs ($54M) (consistency check)")
    print("\n".join(goodput_lines(fig)))
    return fig


def speed() -> float:
    work = Workload(64, 8, Lognormal(median=1500, sigma=0.6, max_len=8192), prompt_len=512)
    cfg = SimConfig(
        Cluster(hardware("h100"), model_shape("7b"), 128, 96),
        work,
        preset("pipeline", 4),
        steps=1000,
    )
    t0 = time.perf_counter()
    simulate(cfg)
    elapsed = time.perf_counter() - t0
    print(f"\n5. Speed: 128 GPUs x 1,000 steps (pipeline, 512 samples a step): {elapsed:.2f} s")
    return elapsed


def main() -> None:
    s, p, m, g = straggler(), pipeline_vs_sync(), mttf(), goodput()
    elapsed = speed()
    headline = {
        "straggler_sync_step_s": round(s["sync_step_s"], 2),
        "straggler_idle_frac": round(1 - s["sync_sampler_util"], 4),
        "straggler_tail_wait_frac": round(s["tail_wait_frac"], 4),
        "straggler_pipeline_speedup": round(s["speedup"], 3),
        "pipeline_speedup_128_h100": round(p["speedup"], 3),
        "mttf_c_cluster_study_gpu_h": round(m["cluster_study"]["c_gpu_hours"]),
        "mttf_c_production_gpu_h": round(m["production"]["c_gpu_hours"]),
        "mttf_worst_fit_err": round(
            max(abs(v) for r in m.values() for k, v in r.items() if k.startswith("err")), 4
        ),
        "goodput_manual": round(g["manual"]["goodput"], 4),
        "goodput_automated": round(g["automated"]["goodput"], 4),
        "goodput_hot_spares": round(g["hot_spares"]["goodput"], 4),
        "sim_seconds_128x1000": round(elapsed, 3),
    }
    print(json.dumps(headline))


if __name__ == "__main__":
    main()
