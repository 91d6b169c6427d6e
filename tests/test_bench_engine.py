"""bench/engine.py at toy sizes: its three parts run, count the same tokens on both sides, and
report the keys the issue names. (The figures themselves are measured by running the script.)"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import engine as bench

pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _args(**over) -> argparse.Namespace:
    kw = dict(
        batch=4, max_new_tokens=6, repeats=1, threads=1, device="cpu", eager=False, dtype="float32"
    )
    return argparse.Namespace(**{**kw, "task_requests": 24, "model": "tiny", **over})


@pytest.mark.slow
def test_engine_bench_parts_report_the_headline_keys(tmp_path, capsys):
    args = _args()
    folder = bench.hf_model_folder(tmp_path / "model", seed=0, name="tiny")
    res = bench.vs_transformers(args, folder)
    res |= bench.continuous_vs_static(args)
    res |= bench.weight_pause(args, folder)
    for key in (
        "engine_tokens_per_s",
        "transformers_tokens_per_s",
        "ratio_vs_transformers",
        "continuous_vs_static_ratio",
        "kernel_floor_ms_per_step",
        "weight_pause_keep_ms",
        "weight_pause_recompute_ms",
    ):
        assert res[key] > 0, key
    assert res["greedy_sequences_identical"] == args.batch  # same tokens as transformers
    assert "eager" not in capsys.readouterr().out  # no CUDA graphs on a CPU: no graph row


def test_model_presets_describe_their_shape():
    assert bench.describe("tiny") == "tiny: llama hidden 256, 4 layers, vocab 512"
    assert "24 layers" in bench.describe("qwen2.5-0.5b")


@pytest.mark.parametrize("fused", [False, True])
def test_sampling_part_reports_the_share_and_runs_the_unfused_engine_beside_the_fused(
    tmp_path, monkeypatch, fused
):
    """Part 4 at toy sizes: its shares lie in (0, 1); where the engine samples through the fused
    kernel (forced here, under Triton's interpreter), an engine without it runs beside it."""
    if fused:
        pytest.importorskip("triton")
        if os.environ.get("TRITON_INTERPRET") != "1":  # a CUDA machine: the kernel is compiled
            pytest.skip("the fused kernel on CPU tensors needs Triton's interpreter")
        import slipstream.engine.engine as engine_module

        monkeypatch.setattr(engine_module, "fused_default", lambda device: True)
    folder = bench.hf_model_folder(tmp_path / "model", seed=0, name="tiny")
    res = bench.sampling_cost(_args(), folder)
    suffixes = ["", "_unfused"] if fused else [""]
    for m in suffixes:
        for key in (f"sampling_share_of_step{m}", f"sampling_share_of_step_t1{m}"):
            assert 0 < res[key] < 1, key
    assert ("sampling_share_of_step_unfused" in res) == fused
