"""bench/gpu.py in its CPU smoke form (`--device cpu --tiny`): every part runs and the JSON
line has the keys the issue names. The figures are taken on a GPU by running the script."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import gpu as bench
from slipstream.model.llama import ModelConfig

KEYS = ("trainer_mfu", "sampler_roofline_share", "publish_s", "pause_s", "pipeline_over_sync")


def test_flops_per_token_golden():
    # Qwen2.5-1.5B, biases aside: per layer h(q + 2kv) + qh + 3hi + 2h = 1536 x 2048 +
    # 1536 x 1536 + 3 x 1536 x 8960 + 3072 = 46,795,776; x 28 = 1,310,281,728; the tied
    # embedding/head 151,936 x 1536 = 233,373,696; final norm 1536: N = 1,543,656,960.
    # 6 N + 6 L d T with d = 12 x 128, T = 1024: 9,261,941,760 + 264,241,152
    cfg = ModelConfig(**bench.SHAPES["qwen2.5-1.5b"])
    assert bench.product_params(cfg) == cfg.num_params() == 1_543_656_960
    assert bench.train_flops_per_token(cfg, 1024) == 9_261_941_760 + 264_241_152


def test_datasheet_figures_by_device_name():
    """The MFU and roofline divide by the lent GPU's own figures: an H100 is not an H200."""
    assert bench.datasheet("NVIDIA H200") == (989.0, 4800.0)
    assert bench.datasheet("NVIDIA H100 80GB HBM3") == (989.0, 3350.0)
    assert bench.datasheet("NVIDIA H100 PCIe") == (756.0, 2000.0)
    assert bench.datasheet("NVIDIA A100-SXM4-80GB") is None
    args = bench.parse([])
    assert bench.peaks(args, "NVIDIA H100 80GB HBM3") == (989.0, 3350.0)
    args.bandwidth_gbs = 3000.0  # a flag wins over the datasheet
    assert bench.peaks(args, "NVIDIA H100 80GB HBM3") == (989.0, 3000.0)
    with pytest.raises(SystemExit, match="--peak-tflops"):
        bench.peaks(args, "NVIDIA A100-SXM4-80GB")  # unknown: both flags needed
    args.peak_tflops = 312.0
    assert bench.peaks(args, "NVIDIA A100-SXM4-80GB") == (312.0, 3000.0)


@pytest.mark.slow
def test_cpu_tiny_smoke_reports_the_headline_keys(capsys):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bench.main(["--device", "cpu", "--tiny", "--parts", "trainer,sampler,weights"])
    finally:
        torch.set_num_threads(n)
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(KEYS) <= line.keys()
    for k in KEYS[:-1]:
        assert math.isfinite(line[k]) and line[k] > 0, k
    assert math.isnan(line["pipeline_over_sync"])  # end to end skipped here
    tiny = line["tiny"]
    assert set(tiny["sampler"]) == {"4", "8"} and tiny["trainer"]["tokens_per_s"] > 0


def test_profile_part_lists_where_time_goes_and_is_not_a_default_part(capsys):
    assert "profile" not in bench.parse([]).parts
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bench.main(["--device", "cpu", "--tiny", "--parts", "profile", "--profile-top", "4"])
    finally:
        torch.set_num_threads(n)
    prof = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tiny"]["profile"]
    for part in ("trainer", "sampler"):
        rows = prof[part]
        assert len(rows) == 4 and all(0 < r["share"] <= 1 and r["calls"] > 0 for r in rows)
        assert [r["ms"] for r in rows] == sorted((r["ms"] for r in rows), reverse=True)
    assert any("mm" in r["op"] for r in prof["trainer"])  # the products are where time goes
