"""The fused sampling kernel (engine.fused), under Triton's interpreter on the CPU (conftest sets
TRITON_INTERPRET where there is no CUDA; on a GPU the same tests run the compiled kernel): its
tile maxima, first indices and block sums against float64 arithmetic; sampling through it draws
from the softmax with exact log-probs, a row's token does not depend on its neighbours or on
whether the CUDA graph's `sample_static` or the eager `sample` drew it, greedy rows take the
first largest logit, a token of probability 0 is never drawn; an engine sampling through it
gives a request the same tokens alone as in a batch."""

from __future__ import annotations

import math

import pytest
import torch

triton = pytest.importorskip("triton")

from slipstream.engine import fused  # noqa: E402
from slipstream.engine.sampling import SUB, fused_default, sample, sample_static  # noqa: E402

TILE = fused.TILE
V = 2 * TILE + 300  # two full tiles and a short one
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _args(n: int, temp: float | torch.Tensor = 1.0, top_k: int = 0, top_p: float = 1.0):
    t = temp if isinstance(temp, torch.Tensor) else torch.full((n,), temp)
    return (
        t.to(DEV),
        torch.full((n,), top_k, dtype=torch.long, device=DEV),
        torch.full((n,), top_p, device=DEV),
        torch.arange(n, device=DEV) * 7919,
        torch.full((n,), 3, dtype=torch.long, device=DEV),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tile_sums_match_float64(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, V, generator=g) * 4).to(dtype)
    x[1, 5] = x[1, 9] = 100.0  # a tie: the first index wins
    x[2, :TILE] = float("-inf")  # a tile with no finite logit
    x[3, TILE + 17] = 60.0  # a tile far above the others
    scale = torch.tensor([[1.0], [2.5], [0.7], [1.6]]) / math.log(2)
    keep = torch.rand(4, V, generator=g) < 0.3
    got = fused.tile_sums(x.to(DEV), scale.to(DEV), SUB, keep.to(DEV))
    want = fused.reference_tile_sums(x, scale, SUB, keep)
    assert torch.equal(got.tile_max.cpu(), want.tile_max)
    assert torch.equal(got.tile_arg.cpu(), want.tile_arg)
    assert int(got.tile_arg[1, 0]) == 5
    assert got.kept is not None and want.kept is not None
    for a, b in ((got.full, want.full), (got.kept, want.kept)):
        torch.testing.assert_close(a.cpu().double(), b.double(), rtol=2e-6, atol=1e-30)
    assert got.full[2, : TILE // SUB].abs().max() == 0  # the empty tile sums 0, not NaN


def test_the_self_check_passes_here_and_cpu_sampling_stays_eager():
    assert fused._self_check(DEV)
    assert not fused_default(torch.device("cpu"))
    assert not fused.available(torch.device("cpu"))


def test_a_failing_or_wrong_kernel_turns_fused_sampling_off_with_a_warning(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("no kernel image for this device")

    def wrong(*a, **k):
        got = fused.reference_tile_sums(*(t.cpu() if isinstance(t, torch.Tensor) else t for t in a))
        return got._replace(full=got.full * 1.001)

    for stand_in, words in ((broken, "no kernel image"), (wrong, "disagrees")):
        monkeypatch.setattr(fused, "tile_sums", stand_in)
        with pytest.warns(UserWarning, match=words):
            assert not fused._self_check.__wrapped__(DEV)


def _logits(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, V, generator=g) * 3
    x[0, TILE + 40] = 12.0  # the row's maximum in its second tile
    return x.to(DEV)


def test_log_probs_are_the_temperature_softmax_of_the_token():
    x = _logits(6, 1)
    temp = torch.tensor([0.6, 1.0, 0.6, 1.3, 0.0, 0.6])
    got = sample(x, *_args(6, temp), fused=True)
    t1 = torch.where(temp > 0, temp, torch.ones_like(temp))[:, None].double()
    ref = (x.cpu().double() / t1).log_softmax(-1).gather(-1, got.tokens.cpu()[:, None])
    torch.testing.assert_close(got.logp.cpu().double(), ref.squeeze(-1), atol=2e-6, rtol=0)
    assert int(got.tokens[4]) == int(x[4].argmax())  # the greedy row


def test_a_rows_token_does_not_depend_on_its_neighbours_or_the_path():
    x = _logits(6, 2)
    temp = torch.tensor([0.6, 0.0, 1.0, 0.6, 0.8, 0.6])
    temp_, k, p, seeds, steps = _args(6, temp)
    plain = sample(x, temp_, k, p, seeds, steps, fused=True)
    static = sample_static(x, temp_, seeds, steps, fused=True)
    p2 = p.clone()
    p2[3] = 0.5  # a neighbour filters
    filt = sample(x, temp_, k, p2, seeds, steps, fused=True)
    assert filt.kept_logmass is not None and float(filt.kept_logmass[3]) < 0
    for i in (0, 1, 2, 4, 5):
        one = slice(i, i + 1)
        alone = sample(x[one], temp_[one], k[one], p[one], seeds[one], steps[one], fused=True)
        want = (int(plain.tokens[i]), float(plain.logp[i]))
        assert (int(alone.tokens), float(alone.logp)) == want
        assert (int(static.tokens[i]), float(static.logp[i])) == want
        assert (int(filt.tokens[i]), float(filt.logp[i])) == want
        assert float(filt.kept_logmass[i]) == 0.0


def test_greedy_takes_the_first_largest_logit_across_tiles():
    x = torch.zeros(2, V)
    x[0, [TILE + 3, 2 * TILE + 9]] = 5.0  # equal maxima in two tiles: the first wins
    x[1, [7, 2 * TILE + 1]] = torch.tensor([4.0, 4.5])
    got = sample(x.to(DEV), *_args(2, 0.0), fused=True)
    assert got.tokens.tolist() == [TILE + 3, 2 * TILE + 1]


def test_no_token_of_probability_zero_is_ever_drawn():
    x = torch.full((V,), float("-inf"))
    x[[3, TILE + 1, 2 * TILE + 6]] = torch.tensor([0.0, 30.0, -30.0])
    x = x.to(DEV)
    n = 64
    got = sample(x[None].expand(n, V), *_args(n), fused=True)
    assert set(got.tokens.tolist()) <= {3, TILE + 1, 2 * TILE + 6}
    assert torch.isfinite(got.logp).all()
    kept = sample(x[None].expand(n, V), *_args(n, top_k=1), fused=True)
    assert set(kept.tokens.tolist()) == {TILE + 1}


@pytest.mark.slow
def test_draws_follow_the_softmax_across_tiles():
    n, temp = 800, 0.7
    x = torch.full((V,), -2.0)
    strong = [5, TILE + 9, 2 * TILE + 100]
    x[strong] = torch.tensor([3.0, 2.5, 2.0])
    got = sample(x.to(DEV)[None].expand(n, V), *_args(n, temp), fused=True)
    p = (x.double() / temp).softmax(-1)
    freq = torch.bincount(got.tokens.cpu(), minlength=V).double() / n
    torch.testing.assert_close(freq[strong], p[strong], atol=0.05, rtol=0)
    assert abs((1 - freq[strong].sum()) - (1 - p[strong].sum())) < 0.05


def test_an_engine_sampling_through_the_kernel_gives_a_request_its_tokens_in_any_batch():
    from slipstream.engine import Engine, Request, SamplingParams
    from test_engine import EOS, _model, _prompts

    model = _model(1, vocab_size=TILE + 100).to(DEV)  # two tiles a row
    prompts = _prompts(4)

    def run(idx: list[int], top_k: int = 0) -> dict[int, list[int]]:
        engine = Engine(model, EOS, num_slots=4, max_len=24, fused_sampling=True)
        assert engine.fused_sampling
        reqs = [Request(prompts[i], SamplingParams(0.9, max_new_tokens=6), seed=i, key=i) for i in idx]  # fmt: skip
        if top_k:  # a neighbour that filters
            reqs.append(Request(prompts[0], SamplingParams(0.9, top_k=top_k, max_new_tokens=6), seed=9, key=-1))  # fmt: skip
        return {c.request.key: c.tokens for c in engine.generate(reqs)}

    together = run([0, 1, 2], top_k=3)
    for i in (0, 1, 2):
        assert run([i])[i] == together[i]


_COMPILE = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from slipstream.engine import fused

sig = dict.fromkeys(["x_stride", "keep_stride", "V", "n_blocks", "n_tiles"], "i32")
sig |= {"x_ptr": "*" + sys.argv[1], "scale_ptr": "*fp32", "keep_ptr": "*u8", "targ_ptr": "*i64"}
sig |= dict.fromkeys(["full_ptr", "kept_ptr", "tmax_ptr"], "*fp32")
sig |= dict.fromkeys(["TILE", "SUB", "NB", "HAS_KEEP"], "constexpr")
for has_keep in (False, True):
    consts = {"TILE": fused.TILE, "SUB": 128, "NB": fused.TILE // 128, "HAS_KEEP": has_keep}
    src = ASTSource(fn=fused._tile_sums, signature=sig, constexprs=consts)
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    print(has_keep, len(out.asm["cubin"]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_kernel_compiles_for_a_hopper_gpu_without_one(dtype, tmp_path):
    """Triton's compiler down to an sm_90 binary, which needs no GPU (in a process without the
    interpreter, whose switch replaces Triton's own functions): what the interpreter lets pass
    and the compiler would not (a shape, a type, a construct) fails here, in CI, not on a lent
    GPU. With and without `keep`; its own cache folder, so it compiles every time."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE, dtype], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    sizes = [int(line.split()[1]) for line in run.stdout.split("\n") if line]
    assert len(sizes) == 2 and min(sizes) > 0
