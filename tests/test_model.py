"""Logit parity with `transformers` for Llama, Qwen2 and Qwen3, both directions."""

from __future__ import annotations

import pytest
import torch

from slipstream.model import load_pretrained, save_pretrained

transformers = pytest.importorskip("transformers")

SMALL = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rope_theta=5000.0,
)


def _hf_model(arch: str, **over):
    cfgs = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }
    cfg_cls, model_cls = cfgs[arch]
    kw = {**SMALL, **over}
    if arch == "qwen3":
        kw.setdefault("head_dim", 16)
    torch.manual_seed(0)
    model = model_cls(cfg_cls(**kw)).float().eval()
    with torch.no_grad():  # random biases, so that a dropped bias would show
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _ids(vocab: int = 97) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (3, 11), generator=g)


CASES = [
    ("llama", {}),
    ("llama", {"tie_word_embeddings": True}),
    ("llama", {"attention_bias": True, "mlp_bias": True}),
    ("llama", {"head_dim": 32, "rms_norm_eps": 0.3}),  # heads wider than hidden / heads
    (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
    ("qwen2", {}),
    ("qwen2", {"tie_word_embeddings": True}),
    ("qwen2", {"head_dim": 8, "rms_norm_eps": 0.3}),
    ("qwen2", {"mlp_bias": True}),  # not read by transformers' Qwen2 (nor Qwen3): no MLP bias
    ("qwen2", {"hidden_act": "swish"}),  # transformers' other name of SiLU
    ("qwen3", {}),
    ("qwen3", {"attention_bias": True}),  # Qwen3's bias covers o_proj too, unlike Qwen2's
    ("qwen3", {"mlp_bias": True}),
    ("qwen3", {"head_dim": 32, "rms_norm_eps": 0.3}),
]


@pytest.mark.parametrize(("arch", "over"), CASES)
def test_logits_match_transformers_both_ways(tmp_path, arch, over):
    hf = _hf_model(arch, **over)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_pretrained(tmp_path / "hf")
    ids = _ids()
    with torch.no_grad():
        want = hf(ids).logits
        got = ours(ids)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)

    save_pretrained(ours, tmp_path / "ours")
    back = type(hf).from_pretrained(tmp_path / "ours").float().eval()
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, want, atol=1e-5, rtol=0)


def test_sharded_checkpoint_roundtrip(tmp_path):
    hf = _hf_model("qwen2")
    ours = load_pretrained(_save(hf, tmp_path / "hf"))
    save_pretrained(ours, tmp_path / "sharded", max_shard_bytes=20_000)
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 2
    again = load_pretrained(tmp_path / "sharded")
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(again(ids), hf(ids).logits, atol=1e-5, rtol=0)
    hf_again = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "sharded").float().eval()
    with torch.no_grad():
        torch.testing.assert_close(hf_again(ids).logits, hf(ids).logits, atol=1e-5, rtol=0)


def _save(model, path):
    model.save_pretrained(path)
    return path


def test_cached_prefill_and_decode_equal_full_forward(tmp_path):
    """Prefill into slots, then one token at a time, gives the full forward's logits."""
    model = load_pretrained(_save(_hf_model("llama"), tmp_path / "m"))
    ids = _ids()
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(num_slots=5, max_len=32)
        slots = torch.tensor([4, 0, 2])
        pre = 6
        pos = torch.arange(pre).expand(3, pre)
        out = [model(ids[:, :pre], positions=pos, cache=cache, slots=slots)]
        for t in range(pre, ids.shape[1]):
            p = torch.full((3, 1), t)
            out.append(model(ids[:, t : t + 1], positions=p, cache=cache, slots=slots))
    torch.testing.assert_close(torch.cat(out, dim=1), full, atol=1e-5, rtol=0)


def test_missing_weights_is_a_clear_error(tmp_path):
    hf = _hf_model("llama")
    hf.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_pretrained(tmp_path / "m")


@pytest.mark.parametrize(
    ("arch", "dropped"), [("llama", "num_key_value_heads"), ("qwen3", "head_dim")]
)
def test_a_config_without_a_key_reads_as_transformers_reads_it(tmp_path, arch, dropped):
    """Older Llama configs have no `num_key_value_heads` (transformers: as many as the
    attention heads); Qwen3's `head_dim` defaults to 128. Before, slipstream's own defaults
    (2 KV heads, hidden / heads) made such a checkpoint fail to load with a size mismatch."""
    import json

    over = {"num_key_value_heads": 4} if arch == "llama" else {"head_dim": 128}
    hf = _hf_model(arch, **over)
    hf.save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    raw = json.loads(path.read_text())
    del raw[dropped]
    path.write_text(json.dumps(raw))
    assert (
        getattr(transformers.AutoConfig.from_pretrained(tmp_path / "hf"), dropped) == over[dropped]
    )
    ours = load_pretrained(tmp_path / "hf")
    with torch.no_grad():
        torch.testing.assert_close(ours(_ids()), hf(_ids()).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("edit", ["rope_theta beside rope_parameters", "no original context"])
def test_llama3_rope_of_a_config_reads_as_transformers_reads_it(tmp_path, edit):
    """transformers takes the rotary settings from `rope_parameters` (or `rope_scaling`) even
    beside a top-level `rope_theta`, and a llama3 scaling without its
    `original_max_position_embeddings` as covering `max_position_embeddings`. Before, the
    first read as unscaled rope and the second took 8192: logits 3e-3 apart at 100 tokens."""
    import json

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip
    _hf_model("llama", rope_scaling=scaling).save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    raw = json.loads(path.read_text())
    rope = raw.get("rope_parameters") or raw["rope_scaling"]
    if edit == "no original context":
        del rope["original_max_position_embeddings"]
    else:
        raw["rope_theta"] = rope["rope_theta"]
    path.write_text(json.dumps(raw))
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").float().eval()
    ids = torch.randint(0, 97, (2, 100), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(
            load_pretrained(tmp_path / "hf")(ids), hf(ids).logits, atol=1e-5, rtol=0
        )


def test_a_top_level_original_context_overrides_the_llama3_scalings_as_in_transformers(tmp_path):
    """transformers takes a top-level `original_max_position_embeddings` (where Phi-3 keeps it)
    over the llama3 scaling's own; slipstream read the scaling's: logits 3e-3 apart."""
    import json

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip
    _hf_model("llama", rope_scaling=scaling).save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(
        json.dumps({**json.loads(path.read_text()), "original_max_position_embeddings": 64})
    )
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").float().eval()
    ids = torch.randint(0, 97, (2, 60), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(
            load_pretrained(tmp_path / "hf")(ids), hf(ids).logits, atol=1e-5, rtol=0
        )


# Llama 3.1's rotary settings (its config.json), on a head of 128
LLAMA31 = dict(
    model_type="llama",
    vocab_size=97,
    hidden_size=512,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=131072,
    rope_theta=500000.0,
)
LLAMA31_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip


@pytest.mark.parametrize("scaling", ["none", "llama3", "llama3 without original context"])
def test_rotary_frequencies_are_transformers_to_the_bit(scaling):
    """Computed in float64 and rounded, 18 to 21 of the 64 frequencies were one float32 step
    from transformers' (which computes in float32), turning rotary angles apart at long
    positions; computed as transformers does, they are equal."""
    from transformers.modeling_rope_utils import _compute_llama3_parameters
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from slipstream.model.hf import config_from_dict
    from slipstream.model.llama import rope_inv_freq

    raw: dict = dict(LLAMA31)
    if scaling != "none":
        raw["rope_scaling"] = dict(LLAMA31_SCALING)
    if scaling == "llama3 without original context":
        del raw["rope_scaling"]["original_max_position_embeddings"]
    theirs = transformers.LlamaConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    if scaling == "none":
        want = LlamaRotaryEmbedding.compute_default_rope_parameters(theirs)[0]
    else:
        want = _compute_llama3_parameters(theirs)[0]
    got = rope_inv_freq(config_from_dict(raw))
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got, want), (got - want).abs().max()


@pytest.mark.parametrize("key", ["low_freq_factor", "high_freq_factor"])
def test_a_llama3_scaling_without_its_frequency_factors_is_refused_as_transformers_does(key):
    """transformers refuses such a config (KeyError: missing required keys); slipstream took
    1.0 and 4.0 for them, so it ran a model that transformers cannot load."""
    from slipstream.model.hf import config_from_dict

    raw: dict = {**LLAMA31, "rope_scaling": dict(LLAMA31_SCALING)}
    del raw["rope_scaling"][key]
    with pytest.raises(KeyError, match=key):
        transformers.LlamaConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    with pytest.raises(ValueError, match=f"llama3 scaling needs a numeric '{key}'"):
        config_from_dict(raw)


@pytest.mark.parametrize(("high", "low"), [(1.0, 1.0), (2.0, 4.0)])
def test_a_llama3_scaling_without_a_band_between_its_factors_is_refused(high, low):
    """transformers only warns that high_freq_factor must exceed low_freq_factor; at or below
    it, the smoothing's slope divides by zero or flips sign. slipstream loaded such a scaling."""
    from slipstream.model.hf import config_from_dict

    scaling = {**LLAMA31_SCALING, "high_freq_factor": high, "low_freq_factor": low}
    said = (
        f"llama3 scaling needs high_freq_factor > low_freq_factor, got high_freq_factor = "
        f"{high} and low_freq_factor = {low}"
    )
    with pytest.raises(ValueError, match=said):
        config_from_dict({**LLAMA31, "rope_scaling": scaling})


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("where", ["rope_parameters", "top level", "rope_scaling"])
def test_a_partial_rotary_factor_is_refused(tmp_path, arch, where):
    """Below 1, transformers' Llama/Qwen2/Qwen3 rotate the whole head regardless (or fail, with
    a llama3 scaling) and vLLM's only that fraction: two models. slipstream loaded it as the
    whole head, silently."""
    import json

    from slipstream.model.hf import config_from_dict

    _hf_model(arch, partial_rotary_factor=0.5).save_pretrained(tmp_path / "hf")
    raw = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert raw["rope_parameters"]["partial_rotary_factor"] == 0.5  # where transformers puts it
    if where != "rope_parameters":
        del raw["rope_parameters"]["partial_rotary_factor"]
    if where == "top level":
        raw["partial_rotary_factor"] = 0.5
    if where == "rope_scaling":
        raw["rope_scaling"] = {"rope_type": "default", "partial_rotary_factor": 0.5}
    said = r"partial_rotary_factor 0\.5 is not supported \(only 1\.0"
    with pytest.raises(ValueError, match=said):
        config_from_dict(raw)
    with pytest.raises(ValueError, match=said):
        load_pretrained(tmp_path / "hf")  # (config.json as transformers wrote it)
    raw["rope_parameters"]["partial_rotary_factor"] = 1.0
    raw.pop("partial_rotary_factor", None)
    raw.pop("rope_scaling", None)
    config_from_dict(raw)  # 1.0 is the whole head


@pytest.mark.parametrize("tied", [False, True])
def test_the_pad_rows_lookup_gradient_is_zero_as_in_transformers(tmp_path, tied):
    """transformers builds the embedding with `padding_idx=pad_token_id`: the lookup gives the
    pad row no gradient (a tied head still does). slipstream's trained that row: its
    embedding gradient differed from transformers' on a batch holding the pad id."""
    pad = 3
    hf = _hf_model("llama", pad_token_id=pad, tie_word_embeddings=tied)
    ours = load_pretrained(_save(hf, tmp_path / "hf"))
    ids = _ids()
    ids[:, -4:] = pad  # right padding
    w = torch.randn(*ids.shape, 97, generator=torch.Generator().manual_seed(2))
    (hf(ids).logits * w).sum().backward()
    (ours(ids) * w).sum().backward()
    want, got = hf.model.embed_tokens.weight.grad, ours.model.embed_tokens.weight.grad
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert got[pad].any() == tied  # a tied head's gradient reaches the row
    ours.zero_grad()
    ours.hidden(ids).sum().backward()  # the lookup alone
    assert not ours.model.embed_tokens.weight.grad[pad].any()

    save_pretrained(ours, tmp_path / "ours")
    again = load_pretrained(tmp_path / "ours")
    assert again.model.embed_tokens.padding_idx == pad
    assert torch.equal(again.model.embed_tokens.weight, ours.model.embed_tokens.weight)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize("edit", ["use_sliding_window false", "sliding_window null"])
def test_a_sliding_layer_without_a_window_is_refused(tmp_path, arch, edit):
    """With `use_sliding_window` false (or a null `sliding_window`) transformers reads no
    window, and a layer that `layer_types` marks `sliding_attention` fails its every forward
    pass. slipstream loaded such a config with full attention on every layer."""
    import json

    from slipstream.model.hf import config_from_dict

    types = ["full_attention", "sliding_attention"]
    window = {"use_sliding_window": True, "sliding_window": 16, "layer_types": types}
    _hf_model(arch, **window).save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    raw = json.loads(path.read_text())
    key, value = ("use_sliding_window", False) if "use" in edit else ("sliding_window", None)
    path.write_text(json.dumps({**raw, key: value}))
    hf = type(_hf_model(arch)).from_pretrained(tmp_path / "hf")
    with pytest.raises((TypeError, ValueError)):
        hf(_ids())  # transformers' own failure
    said = f"layer_types marks layers 'sliding_attention' but {key} is {json.dumps(value)}"
    with pytest.raises(ValueError, match=said):
        load_pretrained(tmp_path / "hf")
    config_from_dict({**raw, key: value, "layer_types": ["full_attention"] * 2})  # no sliding


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_attention_dropout_is_not_applied_and_said_once(tmp_path, arch):
    """transformers drops attention weights in training with `attention_dropout`; the samplers
    never do, and the trainer's log-probs must be theirs. slipstream ignored the field
    without a word; it now trains without dropout and says so in one warning a load."""
    import warnings

    hf = _hf_model(arch, attention_dropout=0.25)
    _save(hf, tmp_path / "hf")
    with pytest.warns(UserWarning) as said:
        ours = load_pretrained(tmp_path / "hf")
    assert [str(w.message) for w in said] == [
        "config.json: attention_dropout = 0.25 is not applied: slipstream trains without "
        "dropout, so that the trainer's log-probs are the sampler's"
    ]
    ours.train()
    with torch.no_grad():
        torch.testing.assert_close(ours(_ids()), hf(_ids()).logits, atol=1e-5, rtol=0)
    save_pretrained(ours, tmp_path / "ours")  # the field is kept
    assert type(hf).from_pretrained(tmp_path / "ours").config.attention_dropout == 0.25
    _save(_hf_model(arch), tmp_path / "none")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_pretrained(tmp_path / "none")  # 0.0: nothing to say
