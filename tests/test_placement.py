"""Placement and precision settings: devices resolved and checked, models built on meta,
checkpoints in the dtype trained."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from slipstream import cli
from slipstream.config import ConfigError, load_config
from slipstream.model.hf import load_pretrained, save_pretrained
from slipstream.model.llama import CausalLM, ModelConfig
from slipstream.model.meta import empty_model
from slipstream.runtime.placement import resolve
from slipstream.train.checkpoint import load_weights, save_checkpoint


def test_auto_placement_for_1_2_and_8_gpus():
    # CPU trainer: every sampler on the CPU
    assert resolve("cpu", "auto", 2, cuda_count=8).samplers == ("cpu", "cpu")
    # one GPU: trainer and sampler share it (colocated)
    p = resolve("cuda", "auto", 1, cuda_count=1)
    assert p.trainer == "cuda:0" and p.samplers == ("cuda:0",) and p.colocated(0)
    # two GPUs: the sampler gets the one the trainer does not use
    p = resolve("cuda:0", "auto", 1, cuda_count=2)
    assert p.samplers == ("cuda:1",) and not p.colocated(0)
    # eight GPUs, seven samplers: one per free GPU; more samplers round-robin over them
    assert resolve("cuda:0", "auto", 7, 8).samplers == tuple(f"cuda:{i}" for i in range(1, 8))
    assert resolve("cuda:3", "auto", 3, 4).samplers == ("cuda:0", "cuda:1", "cuda:2")
    assert resolve("cuda:1", "auto", 3, 2).samplers == ("cuda:0",) * 3


def test_explicit_sampler_devices_are_checked():
    assert resolve("cuda:0", ["cuda:0", "cuda:1"], 2, 2).samplers == ("cuda:0", "cuda:1")
    with pytest.raises(ConfigError, match=r"runtime.sampler_devices: 1 device\(s\) for"):
        resolve("cpu", ["cpu"], 2, 0)
    with pytest.raises(ConfigError, match=r"runtime.sampler_devices\[1\]: 'cuda:2'.*2 CUDA"):
        resolve("cuda:0", ["cuda:0", "cuda:2"], 2, 2)


def test_a_cuda_device_on_a_machine_without_one_is_a_one_line_error():
    with pytest.raises(ConfigError) as e:
        resolve("cuda", "auto", 1, cuda_count=0)
    msg = str(e.value)
    assert msg.startswith("trainer.device: 'cuda'") and "no CUDA device" in msg
    assert "\n" not in msg
    with pytest.raises(ConfigError, match=r"trainer\.device: expected cpu, cuda or cuda:N"):
        load_config(None, ["trainer.device=gpu0"])
    with pytest.raises(ConfigError, match=r"runtime.sampler_devices\[0\]"):
        load_config(None, ['runtime.sampler_devices=["tpu"]'])
    with pytest.raises(ConfigError, match=r"model\.dtype"):
        load_config(None, ["model.dtype=float16"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a CUDA device")
def test_train_with_cuda_on_a_cpu_machine_exits_2_before_writing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    rc = cli.main(["train", "trainer.device=cuda", f'run.dir="{run_dir}"', "run.quiet=true"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("slipstream train: error: trainer.device: 'cuda'") and "\n" not in err
    assert not run_dir.exists()  # checked before the run folder is made


def test_sampler_process_sees_only_its_gpu():
    p = resolve("cuda:0", "auto", 2, 3)
    assert p.sampler_env(0, parent_visible="")["CUDA_VISIBLE_DEVICES"] == "1"
    # the parent's own CUDA_VISIBLE_DEVICES numbering: its cuda:2 is physical GPU 7
    assert p.sampler_env(1, parent_visible="4,6,7")["CUDA_VISIBLE_DEVICES"] == "7"
    assert p.local_sampler_device(1) == "cuda:0"
    cpu = resolve("cpu", "auto", 1, 0)
    assert cpu.sampler_env(0)["CUDA_VISIBLE_DEVICES"] == ""  # hides every GPU
    assert cpu.local_sampler_device(0) == "cpu"


def _cfg(tied: bool = True) -> ModelConfig:
    return ModelConfig(
        model_type="qwen2", vocab_size=50, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        tie_word_embeddings=tied,
    )  # fmt: skip


INITS = ("kaiming_uniform_", "uniform_", "normal_", "trunc_normal_", "xavier_uniform_")


def _count_inits(monkeypatch) -> list[str]:
    """Every call of nn.init's random initialisers, by the device of the tensor it fills."""
    seen: list[str] = []
    for name in INITS:
        real = getattr(torch.nn.init, name)

        def spy(*a, _real=real, **k):
            t = a[0] if a else k["tensor"]
            seen.append(t.device.type)
            # on meta there is nothing to fill (and under torch.device("meta") the real
            # initialiser would dispatch back to this patched name)
            return t if t.device.type == "meta" else _real(*a, **k)

        monkeypatch.setattr(torch.nn.init, name, spy)
    return seen


def test_meta_build_runs_no_random_init_and_loads_the_same_weights(tmp_path, monkeypatch):
    torch.manual_seed(0)
    ref = CausalLM(_cfg())
    save_pretrained(ref, tmp_path / "m")
    seen = _count_inits(monkeypatch)
    CausalLM(_cfg())  # the spy sees an ordinary build
    assert seen and set(seen) == {"cpu"}
    seen.clear()
    loaded = load_pretrained(tmp_path / "m")
    empty = empty_model(_cfg(), "cpu", torch.bfloat16)
    assert set(seen) <= {"meta"}  # initialisers ran on storage-less tensors only
    assert empty.lm_head.weight is empty.model.embed_tokens.weight  # the tie survives
    assert all(p.dtype == torch.bfloat16 and p.device.type == "cpu" for p in empty.parameters())
    for k, v in ref.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    torch.testing.assert_close(loaded.inv_freq, ref.inv_freq, atol=0, rtol=0)
    ids = torch.tensor([[3, 4, 5]])
    torch.testing.assert_close(loaded(ids), ref(ids), atol=0, rtol=0)


def test_meta_build_runs_no_meta_kernel_that_imports_dynamo():
    """A model built to be loaded (`empty_model`, `load_pretrained`) runs no operator on the
    meta device whose kernel is a Python reference: the first such call imports torch._dynamo,
    about a second in every trainer and sampler process (the embedding's normal_ and the rotary
    frequencies' arange did). In a fresh interpreter, since this one has imported it."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from slipstream.model.llama import ModelConfig\n"
        "from slipstream.model.meta import empty_model\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        "cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64,"
        " num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)\n"
        "m = empty_model(cfg)\n"
        "assert m.inv_freq.shape == (4,) and m.inv_freq.device.type == 'cpu'\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_bfloat16_checkpoint_has_its_dtype_and_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = CausalLM(_cfg(tied=False))
    save_pretrained(model, tmp_path / "m", dtype=torch.bfloat16)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(str(tmp_path / "m" / "model.safetensors")).values()} == {
        torch.bfloat16
    }
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"), dtype="auto")
    assert next(hf.parameters()).dtype == torch.bfloat16
    ids = torch.tensor([[3, 4, 5, 6]])
    ours = CausalLM(_cfg(tied=False)).to(torch.bfloat16)
    ours.load_state_dict(load_pretrained(tmp_path / "m", dtype=torch.bfloat16).state_dict())
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits.float(), ours(ids).float(), atol=0.05, rtol=0.05)


def test_bfloat16_checkpoint_resumes_from_the_float32_master_weights(tmp_path):
    from slipstream.model.builtin import builtin_tokenizer

    torch.manual_seed(0)
    model = CausalLM(_cfg())
    ck = save_checkpoint(tmp_path, 3, model, builtin_tokenizer(), {}, {}, dtype=torch.bfloat16)
    assert json.loads((ck / "model" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    fresh = CausalLM(_cfg())
    load_weights(fresh, ck / "model")
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k  # exact: not the bf16 rounding
    # a float32 run writes no second copy
    ck32 = save_checkpoint(tmp_path / "b", 3, model, builtin_tokenizer(), {}, {})
    assert not (ck32 / "master.safetensors").exists()


def test_a_bfloat16_sampler_makes_auto_proximal_recompute():
    from slipstream.run.components import build_trainer

    def proximal(*over: str) -> str:
        cfg = load_config(None, ['schedule.name="sync"', "trainer.proximal=auto", *over])
        return build_trainer(cfg, CausalLM(_cfg()), 0).proximal

    assert proximal() == "none"  # float32, lag 0: the sampler's log-probs are the trainer's
    assert proximal("model.dtype=bfloat16", 'runtime.kind="local"') == "recompute"
    assert proximal("model.dtype=bfloat16") == "none"  # in-process: the engine shares fp32 weights


def test_the_trainers_cuda_device_becomes_the_current_one(monkeypatch):
    """Consistency check (CPU): `use_device` sets the current CUDA device to the trainer's,
    so kernels launched without a device (Triton's, CUDA graphs) run there; for `cpu` it
    touches no CUDA. Whether a cuda:1 engine then samples right needs two GPUs (not tested)."""
    import torch

    from slipstream.runtime.placement import use_device

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    use_device("cpu")
    use_device("cuda:1")
    assert calls == ["cuda:1"]
