"""The default pipeline on one GPU: a Qwen2.5-0.5B-shaped random model in bfloat16, trainer and
sampler colocated, 10 steps. Skipped where no GPU is present (CI has none); run on one with
`python -m pytest tests/test_pipeline_cuda.py -s`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_pipeline_colocated_on_one_gpu_bf16_qwen_0_5b_shape(tmp_path):
    import gpu as bench
    from slipstream.config import load_config
    from slipstream.model.builtin import builtin_tokenizer
    from slipstream.model.hf import save_pretrained
    from slipstream.run.launch import train_async
    from slipstream.schedule.presets import preset

    folder = tmp_path / "model"
    model = bench.random_model("qwen2.5-0.5b", torch.device("cuda:0"), torch.float32)
    model.config.eos_token_id, model.config.pad_token_id = 1, 0
    save_pretrained(model, folder)
    builtin_tokenizer().save(folder)
    del model
    torch.cuda.empty_cache()
    cfg = load_config(None, [
        f'model.path="{folder}"', "model.dtype=bfloat16", 'trainer.device="cuda:0"',
        'runtime.kind="local"', 'runtime.sampler_devices=["cuda:0"]', 'schedule.name="pipeline"',
        "run.steps=10", "run.quiet=true", f'run.dir="{tmp_path / "run"}"',
        "filters.zero_variance=false", "trainer.batch_prompts=8", "sampling.group_size=4",
        "sampling.max_new_tokens=64", "eval.every=100", "eval.num_prompts=8",
        "engine.memory_fraction=0.3", "trainer.micro_batch_tokens=8192",
    ])  # fmt: skip
    summary = train_async(cfg)
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert summary["steps"] == 10
    assert ledger["balanced"] and summary["ledger"]["balanced"]
    assert summary["weight_channel"] == "CudaIpcWeights"  # device to device, no host copy
    assert summary["placement"] == {"trainer": "cuda:0", "samplers": ["cuda:0"]}
    steps = [r for r in _records(tmp_path / "run" / "metrics.jsonl") if "train/loss" in r]
    assert len(steps) == 10
    K = preset("pipeline", None).max_lag
    assert all(r["staleness/lag_max"] <= K for r in steps)
    for r in steps:
        assert 0 < r["staleness/ess_token"] <= 1.0 + 1e-9
        assert "staleness/mismatch_kl" in r or "mismatch/kl" in r
        assert r["weights/publish_s"] >= 0 and r["weights/pause_s"] >= 0
    print(
        f"\npeak GPU memory of the trainer: {summary['trainer_peak_gib']:.2f} GiB; "
        f"publish {steps[-1]['weights/publish_s'] * 1e3:.1f} ms"
    )
