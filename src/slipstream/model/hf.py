"""Hugging Face checkpoint folders: config.json + one or sharded *.safetensors.

Weights load only through safetensors (never pickle). Saving writes the same layout back,
so a slipstream checkpoint loads in `transformers` and in inference servers unchanged.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from slipstream.model.llama import ARCHITECTURES, CausalLM, ModelConfig, rope_type
from slipstream.text import first_line

_CONFIG_KEYS = {f.name for f in fields(ModelConfig)} - {"extra"}
_DROP_ON_LOAD = {"architectures", "torch_dtype", "dtype", "transformers_version"}


# transformers' defaults for keys a config.json may leave out, where they differ from
# ModelConfig's (which describe the built-in model): read with these, as transformers reads it
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"max_position_embeddings": 2048},
    "qwen2": {"max_position_embeddings": 32768},
    "qwen3": {"max_position_embeddings": 32768, "head_dim": 128},
}


def config_from_dict(raw: dict[str, Any]) -> ModelConfig:
    """A `ModelConfig` from a config.json dict; unknown keys are kept in `extra`. A key left
    out (or null) takes transformers' default for the model type: no grouped-query attention
    without `num_key_value_heads` (older Llama configs), Qwen3's head_dim of 128."""
    known = {k: v for k, v in raw.items() if k in _CONFIG_KEYS and v is not None}
    for k, v in _HF_DEFAULTS.get(str(raw.get("model_type", "llama")), {}).items():
        known.setdefault(k, v)
    if "num_attention_heads" in known:
        known.setdefault("num_key_value_heads", known["num_attention_heads"])
    extra = {k: v for k, v in raw.items() if k not in _CONFIG_KEYS and k not in _DROP_ON_LOAD}
    check_rope_fields(raw)
    # as transformers 5 reads them: the rotary settings are `rope_scaling` (older configs) else
    # `rope_parameters`, even beside a top-level rope_theta, and their rope_theta wins over it
    rope = raw.get("rope_scaling") or raw.get("rope_parameters")
    if isinstance(rope, dict):
        if rope.get("rope_theta") is not None:
            known["rope_theta"] = rope["rope_theta"]
        if rope_type(rope) != "default":
            known["rope_scaling"] = rope
        # and a top-level original_max_position_embeddings (where Phi-3 keeps it) wins over a
        # llama3 scaling's own
        old_ctx = raw.get("original_max_position_embeddings")
        if old_ctx is not None and rope_type(rope) == "llama3":
            known["rope_scaling"] = {**rope, "original_max_position_embeddings": old_ctx}
    return ModelConfig(**known, extra=extra)


# the dropout transformers' Llama/Qwen2/Qwen3 apply in training (on the attention weights)
DROPOUT_FIELDS = ("attention_dropout",)


def dropout_notice(cfg: ModelConfig) -> str | None:
    """One line when `cfg` asks for dropout in training, which slipstream never applies; None
    when it does not (every released Llama and Qwen has 0.0). The samplers score a completion
    without dropout, and the policy-gradient ratio and KL terms hold only while the trainer's
    log-probs are theirs (TRL's GRPOConfig has `disable_dropout` for the same reason)."""
    for key in DROPOUT_FIELDS:
        p = cfg.extra.get(key)
        if isinstance(p, int | float) and not isinstance(p, bool) and p > 0:
            return (
                f"config.json: {key} = {p} is not applied: slipstream trains without dropout, "
                "so that the trainer's log-probs are the sampler's"
            )
    return None


def check_rope_fields(raw: dict[str, Any]) -> None:
    """A ValueError naming the field unless config.json's `rope_scaling` and `rope_parameters`
    are each absent, null or a JSON object (a string or a list is not a rotary setting)."""
    for key in ("rope_scaling", "rope_parameters"):
        value = raw.get(key)
        if value is not None and not isinstance(value, dict):
            found = json.dumps(value)
            found = found if len(found) <= 60 else found[:57] + "..."
            raise ValueError(f"{key} must be a JSON object of rotary settings, got {found}")


def config_to_dict(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """config.json of `cfg`; `torch_dtype` is `dtype`, the dtype the weights are saved in."""
    out = {k: v for k, v in asdict(cfg).items() if k != "extra"}
    out = {**cfg.extra, **out}
    out["architectures"] = [ARCHITECTURES[cfg.model_type]]
    out["torch_dtype"] = str(dtype).removeprefix("torch.")
    if out["rope_scaling"] is None:
        del out["rope_scaling"]
    return out


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    found = sorted(path.glob("*.safetensors"))
    if not found:
        raise FileNotFoundError(
            f"{path}: no model.safetensors, model.safetensors.index.json or *.safetensors "
            "(only safetensors weights are loaded; convert .bin checkpoints first)"
        )
    return found


def load_pretrained(
    path: str | os.PathLike[str],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> CausalLM:
    """Load a Llama/Qwen2/Qwen3 checkpoint folder into a slipstream `CausalLM` on `device`.

    The model is built on the meta device (no random initialisation) and its parameters are
    the checkpoint's tensors, read by safetensors straight onto `device` and cast to `dtype`.
    A config's dropout is not applied, with a warning (`dropout_notice`).
    """
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"{path}: no config.json (expected a Hugging Face model folder)")
    cfg = config_from_dict(json.loads(cfg_file.read_text()))
    notice = dropout_notice(cfg)
    if notice:  # (attributed to this line, so that a process says it once)
        warnings.warn(notice, UserWarning, stacklevel=1)
    with torch.device("meta"):
        model = CausalLM(cfg)
    state: dict[str, torch.Tensor] = {}
    for f in _weight_files(path):
        state.update(load_file(str(f), device=str(device)))
    expected = _expected_shapes(model)
    _check_names(path, cfg, expected.keys(), state.keys())
    state = {k: v.to(dtype) for k, v in state.items() if k in expected}
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # the rotary buffer was built on meta: rebuild it for real
    from slipstream.model.llama import rope_inv_freq

    model.inv_freq = rope_inv_freq(cfg).to(device)
    return model.eval()


def _expected_shapes(model: CausalLM) -> dict[str, tuple[int, ...]]:
    """The tensors a checkpoint of `model` holds, with their shapes (a tied head has none)."""
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


def _check_names(
    path: Path, cfg: ModelConfig, expected: Iterable[str], found: Iterable[str]
) -> None:
    """A ValueError unless the checkpoint's tensor names `found` are the `expected` ones (a
    tied head's copy and rotary buffers aside)."""
    want, have = set(expected), set(found)
    if cfg.tie_word_embeddings:
        have.discard("lm_head.weight")
    missing = want - have
    unexpected = {k for k in have - want if not k.endswith("rotary_emb.inv_freq")}
    if missing or unexpected:
        raise ValueError(
            f"{path}: weights do not match a {cfg.model_type} model: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )


def check_weights(path: Path, cfg: ModelConfig) -> None:
    """The folder's safetensors files exist and hold exactly the tensors, of the shapes, that
    config.json's model has, read from the files' headers (no weight is loaded); else a
    ValueError naming the file or the tensor (a missing shard, a truncated file, a config
    whose sizes are not the weights')."""
    from safetensors import safe_open

    with torch.device("meta"):
        expected = _expected_shapes(CausalLM(cfg))
    shapes: dict[str, tuple[int, ...]] = {}
    for f in _weight_files(path):
        if not f.is_file():
            raise ValueError(f"{f}: named by model.safetensors.index.json, but missing")
        try:
            with safe_open(str(f), framework="pt") as sf:
                names = sf.keys()  # (safe_open is not iterable)
                shapes |= {k: tuple(sf.get_slice(k).get_shape()) for k in names}
        except Exception as e:  # a truncated or foreign file: safetensors' own error
            raise ValueError(f"{f}: not a readable safetensors file ({first_line(e)})") from None
    _check_names(path, cfg, expected, shapes)
    for name, shape in expected.items():
        if shapes[name] != shape:
            raise ValueError(
                f"{path}: {name} is {list(shapes[name])} in the weights but {list(shape)} by "
                "config.json (its sizes are not the weights')"
            )


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes the tensors hold: a checkpoint shard's size, or (a model's `parameters()`) what a
    staging copy of the model takes (run.sampler)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def save_pretrained(
    model: CausalLM,
    path: str | os.PathLike[str],
    max_shard_bytes: int = 5 * 2**30,
    dtype: torch.dtype | None = None,
) -> None:
    """Write `config.json` and safetensors weights (sharded above `max_shard_bytes`), cast to
    `dtype` (None: the model's own); config.json's `torch_dtype` names the dtype written."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    state = {
        k: v.detach().to("cpu", dtype or v.dtype).contiguous()
        for k, v in model.state_dict().items()
    }
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state.items():
        nbytes = tensor_bytes([t])
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(path / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(path / fname), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, fname))
        total = tensor_bytes(state.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    dtype = next((t.dtype for t in state.values() if t.is_floating_point()), torch.float32)
    (path / "config.json").write_text(json.dumps(config_to_dict(cfg, dtype), indent=2))
