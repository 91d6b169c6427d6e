"""Accelerator presets and the CPU profile: the numbers the cost model turns into seconds.

Datasheet peaks are what vendors quote for dense bf16 math and HBM; the efficiencies say how
much of each a real engine reaches. They are assumptions, stated once here:

- decode reaches ~70 % of HBM bandwidth (vLLM/SGLang at large batch read weights and KV cache
  at 60-80 % of peak) and ~50 % of peak FLOP/s when it is compute bound;
- prefill is a large matmul: ~60 % of peak FLOP/s;
- training reaches 30 % MFU: pre-training of dense models gets 35-45 %, but an RL trainer sees
  sequences of very different lengths, small micro-batches and frequent weight pushes;
- one decode step has a fixed ~3 ms overhead (kernel launches, sampling, scheduler) even at
  batch 1, which is what makes a step at small batch cost about the same as at batch 32.

The CPU profile's peaks are measured on the development machine (`measure_cpu`); its costs are
then fitted from a real local run by `slipstream sim --calibrate RUN_DIR` (calibrate.py), which
sets the measured lines `decode_seq_s`, `decode_ctx_s`, `prefill_token_s` and `train_token_s`
in place of the roofline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

GIB = 1024**3


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or one CPU host) as the cost model sees it. Units in field docs."""

    name: str
    peak_flops: float
    """Dense bf16 FLOP/s (fp32 for the CPU profile)."""
    hbm_bandwidth: float
    """Memory bandwidth, bytes/s."""
    memory_bytes: float
    """Device memory, bytes."""
    interconnect_bandwidth: float
    """Bytes/s one device sends or receives to another node (weight sync between pools)."""
    local_bandwidth: float
    """Bytes/s between devices of one node (NVLink): weight resharding when colocated."""
    price_per_hour: float
    """Dollars per device-hour (on-demand cloud list prices, 2025)."""
    decode_bw_eff: float = 0.7
    """Fraction of `hbm_bandwidth` a decode step reaches."""
    decode_flop_eff: float = 0.5
    """Fraction of `peak_flops` a compute-bound decode step reaches."""
    prefill_flop_eff: float = 0.6
    """Fraction of `peak_flops` prefill reaches."""
    mfu: float = 0.3
    """Model FLOP utilisation of a training step (6 x params x tokens FLOPs)."""
    decode_overhead_s: float = 3e-3
    """Fixed seconds per decode step (launches, sampling, scheduling)."""
    train_overhead_s: float = 2.0
    """Fixed seconds per optimizer step (optimizer, all-reduce latency, data loading)."""
    sync_latency_s: float = 1.0
    """Fixed seconds per weight sync on top of bytes / bandwidth (handshake, engine reload)."""
    memory_util: float = 0.9
    """Fraction of memory an inference engine may use (vLLM `gpu_memory_utilization`)."""
    max_num_seqs: int = 256
    """Most sequences one engine decodes at once (vLLM `max_num_seqs`)."""
    # Measured lines that replace the roofline when set (calibrate.py fits them on a CPU,
    # where a tiny model's step is launch overhead plus work linear in the batch).
    decode_seq_s: float | None = None
    """Seconds a decode step costs per sequence in the batch."""
    decode_ctx_s: float | None = None
    """Seconds a decode step costs per context token held by the batch."""
    prefill_token_s: float | None = None
    """Seconds per prefilled prompt token."""
    train_token_s: float | None = None
    """Device-seconds per trained token (divided by the number of trainer devices)."""


HARDWARE: dict[str, Hardware] = {
    # H100 SXM: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3, 80 GB; 400 Gb/s InfiniBand per GPU,
    # 900 GB/s NVLink.
    "h100": Hardware("h100", 989e12, 3.35e12, 80e9, 50e9, 450e9, 2.5),
    # H200: the H100's compute with 4.8 TB/s HBM3e and 141 GB.
    "h200": Hardware("h200", 989e12, 4.8e12, 141e9, 50e9, 450e9, 3.5),
    # A100 SXM 80 GB: 312 TFLOP/s bf16, 2.04 TB/s HBM2e; 200 Gb/s IB, 600 GB/s NVLink.
    "a100": Hardware("a100", 312e12, 2.04e12, 80e9, 25e9, 300e9, 1.5, decode_overhead_s=4e-3),
    # This 2-core Xeon development machine, measured with `measure_cpu` (fp32 1024^3 matmul,
    # 64 MiB copy). Price: a 2-vCPU cloud instance. The efficiencies and overheads are
    # placeholders until `calibrate` fits them from a local run.
    "cpu": Hardware(
        "cpu",
        peak_flops=1.08e11,
        hbm_bandwidth=1.7e10,
        memory_bytes=23 * GIB,
        interconnect_bandwidth=1.7e10,
        local_bandwidth=1.7e10,
        price_per_hour=0.1,
        decode_bw_eff=0.5,
        decode_flop_eff=0.3,
        prefill_flop_eff=0.5,
        mfu=0.2,
        decode_overhead_s=2e-3,
        train_overhead_s=0.05,
        sync_latency_s=0.01,
        max_num_seqs=1024,
    ),
}


def hardware(name: str) -> Hardware:
    """The preset called `name` (h100, h200, a100, cpu)."""
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; valid: {', '.join(HARDWARE)}")
    return HARDWARE[name]


def measure_cpu(threads: int | None = None, repeats: int = 10) -> Hardware:
    """Measure this machine's fp32 matmul FLOP/s and copy bandwidth; return a CPU profile.

    Takes about a second. The result replaces `peak_flops` and `hbm_bandwidth` of the `cpu`
    preset; efficiencies and overheads are left for `calibrate` to fit.
    """
    import torch  # deferred: the rest of sim needs only numpy

    if threads is not None:
        torch.set_num_threads(threads)
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm up the BLAS thread pool
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    flops = 2 * n**3 * repeats / (time.perf_counter() - t0)
    x = torch.empty(16 * 1024 * 1024)
    y = torch.empty_like(x)
    y.copy_(x)
    t0 = time.perf_counter()
    for _ in range(repeats):
        y.copy_(x)
    # A copy reads and writes every byte.
    bandwidth = 2 * x.numel() * 4 * repeats / (time.perf_counter() - t0)
    return replace(HARDWARE["cpu"], peak_flops=flops, hbm_bandwidth=bandwidth)
