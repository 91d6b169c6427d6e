"""Chunked log-probs from hidden states: equal to the full computation, bounded in memory."""

from __future__ import annotations

import ctypes
import sys

import pytest
import torch

from slipstream.model.llama import CausalLM, ModelConfig
from slipstream.train.batch import collate, token_logprobs
from slipstream.train.logprobs import chunk_rows, chunked_logprobs, completion_logprobs
from slipstream.types import FinishReason, Sample


def _model(tied: bool = False, vocab: int = 61) -> CausalLM:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
    )  # fmt: skip
    model = CausalLM(cfg)
    with torch.no_grad():  # far from uniform, so that softmax and entropy are not trivial
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    return model


def _batch(vocab: int = 61, seed: int = 1):
    """Ragged rows: prompts of 2-6 tokens, completions of 1-9, right-padded."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(6):
        p, c = (
            int(torch.randint(2, 7, (1,), generator=g)),
            int(torch.randint(1, 10, (1,), generator=g)),
        )
        ids = torch.randint(1, vocab, (p + c,), generator=g).tolist()
        samples.append(Sample(str(i), ids[:p], ids[p:], [-1.0] * c, [0] * c, FinishReason.STOP))
    return collate(samples, [float(i) - 2.5 for i in range(6)], list(range(6)), pad_id=0)


def _grads(model: CausalLM, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads_close(got: dict, ref: dict) -> None:
    """Gradients equal to 1e-5 of each tensor's largest entry. The chunked backward sums the
    vocabulary in another order: a layer-norm weight's gradient, a sum over every position,
    was seen 5.0e-6 off at scale 4.9 (1.0e-6 relative) on this CPU, so 1e-6 relative is at
    float32's rounding and fails by chance; the log-probs themselves are held to 1e-6."""
    assert ref.keys() == got.keys()
    for name in ref:
        scale = float(ref[name].abs().max())
        err = float((got[name] - ref[name]).abs().max())
        assert err <= 1e-5 * max(scale, 1.0), f"{name}: {err:.2e} off at scale {scale:.2e}"


def _loss(logp: torch.Tensor, ent: torch.Tensor, batch) -> torch.Tensor:
    # a weighted sum, so that every row's gradient is distinct (advantages as weights)
    return (logp * batch.advantages[:, None] * batch.loss_mask).sum()


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_chunked_equals_full_logp_entropy_and_gradient(temperature, tied, packed):
    """float32, 1e-6: chunks of 2 rows (so many chunks), padded or packed, tied head or not."""
    model, batch = _model(tied), _batch()
    mask = batch.loss_mask
    ref_logp, ref_ent = token_logprobs(model, batch, temperature)
    ref = _grads(model, _loss(ref_logp, ref_ent, batch))
    logp, ent = completion_logprobs(model, batch, temperature, chunk_elements=2 * 61, packed=packed)
    got = _grads(model, _loss(logp, ent, batch))
    # 1e-6 absolute plus 1e-6 relative: values of 3 nats sit 2.4e-7 apart in float32, and the
    # two sum 61 terms in different orders
    torch.testing.assert_close(logp[mask], ref_logp[mask], atol=1e-6, rtol=1e-6)
    # entropy sums a vocabulary of p log p terms: 1e-5 (its 1e-6 failed on another CPU's kernels)
    torch.testing.assert_close(ent[mask], ref_ent[mask].detach(), atol=1e-5, rtol=1e-5)
    assert not ent.requires_grad  # entropy is a diagnostic: no gradient
    assert (logp[~mask] == 0).all() and (ent[~mask] == 0).all()
    _assert_grads_close(got, ref)


def test_chunk_rows_bounds_the_logits_of_a_chunk():
    assert chunk_rows(32000, 1 << 22) == 131  # 4194304 // 32000
    assert chunk_rows(200_000, 1000) == 1  # never zero rows


def test_activation_checkpointing_gives_the_same_gradient():
    model, batch = _model(), _batch()
    ref = _grads(model, _loss(*completion_logprobs(model, batch, 0.6), batch))
    model.activation_checkpointing = True
    model.train()
    calls = []
    hook = model.model.layers[0].register_forward_pre_hook(lambda *a: calls.append(1))
    got = _grads(model, _loss(*completion_logprobs(model, batch, 0.6), batch))
    hook.remove()
    assert len(calls) == 2  # the layer ran again in the backward pass: it was checkpointed
    _assert_grads_close(got, ref)


def test_bfloat16_autocast_is_close_to_float32_and_grads_stay_float32():
    model, batch = _model(), _batch()
    mask = batch.loss_mask
    ref, _ = completion_logprobs(model, batch, 0.6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, ent = completion_logprobs(model, batch, 0.6)
    grads = _grads(model, _loss(logp, ent, batch))
    assert logp.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads.values())
    assert all(torch.isfinite(g).all() for g in grads.values())
    # bfloat16 keeps 8 mantissa bits (relative error 2^-9 per rounding); on this model's
    # log-probs of magnitude ~5 the products' error stays well under 0.1 nats
    assert (logp[mask] - ref[mask]).abs().max() < 0.1


def _libc():
    return ctypes.CDLL("libc.so.6")


def _status_mib(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def _peak_rss_increase(fn) -> float:
    """MiB by which the process's peak resident memory rose over its resident memory while
    `fn` ran: freed heap returned first (`malloc_trim`), then the kernel's high-water mark
    reset (writing 5 to /proc/self/clear_refs, Linux >= 4.0). It counts every allocator,
    torch's CPU one included, and can only overstate (allocator caching), never miss."""
    _libc().malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status_mib("VmRSS:")
    fn()
    return _status_mib("VmHWM:") - base


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_peak_memory_of_the_logprob_path_at_32k_vocab_and_2048_tokens():
    """Forward + backward of the head over T = 2048 positions of a 32,000-token vocabulary.

    One float32 `[2048, 32000]` logits tensor is 250 MiB; the full path keeps the logits, their
    log-softmax and its gradient (>= 750 MiB). With 4 MiB chunks the whole chunked path must
    stay under 128 MiB: half of a single full-logits tensor (measured: 44-70 MiB).
    """
    T, V, H = 2048, 32000, 64
    torch.manual_seed(0)
    h = torch.randn(T, H, requires_grad=True)
    w = (torch.randn(V, H) * 0.1).requires_grad_()
    targets = torch.randint(0, V, (T,))
    # the measurement sees an allocation of the size it must rule out
    assert _peak_rss_increase(lambda: torch.empty(T, V).fill_(1.0)) > 240

    def run() -> None:
        logp, _ = chunked_logprobs(h, w, targets, 0.6, chunk_elements=1 << 20)
        logp.sum().backward()

    peak = _peak_rss_increase(run)
    assert h.grad is not None and w.grad is not None and torch.isfinite(w.grad).all()
    assert peak < 128, f"chunked log-prob path peaked at {peak:.0f} MiB"
