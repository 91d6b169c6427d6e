"""The sampler's pass over the logits as one Triton kernel (a GPU's decode step).

`engine.sampling` draws a token by inverse CDF from block sums of `exp(x / t - m)` (blocks of
`SUB` entries). Eager on a GPU, the one-chunk path reads the `[rows, vocab]` logits about seven
times (the float32 copy, the row maximum, the scaled and shifted copy, its exponential in
place, the block sums, the argmax): at 256 slots and Qwen2.5's vocabulary, 155 MB each, 14.7 %
of a Qwen2.5-0.5B decode step on an H200 even replayed as a CUDA graph (bench/results/gpu_s29).
Here one kernel reads each logit once, in its own dtype: a program per (row, tile of `TILE`
entries) takes the tile's maximum and its first index, and the tile's block sums of
`exp2((x - m_tile) log2 e / t)`, against the tile's own maximum (so nothing overflows and no
second pass waits for the row's maximum; `x - m_tile` first, exact near the top where the mass
is, where the eager path's `x log2 e / t - m log2 e / t` rounds a product of the logit's
size). `sampling` then rescales the block sums to the row's maximum in float64 (a
`[rows, vocab / SUB]` table, 128 times smaller than the logits), as its multi-chunk path does
after an overflow.

Invariance. A program reads one row's tile and that row's scale; the reduction trees are fixed
by `TILE` and `SUB`, not by the batch, so a row's sums, and with them its token, do not depend
on its slot, the batch, or its neighbours' settings. With top-k / top-p (`keep`), the kept sums
are taken beside the full ones by the same program, and the full sums are the same arithmetic
with or without `keep`: a row that does not filter gets the same token in a batch where another
row filters. The kernel's `exp2` is the device's (an approximation on NVIDIA GPUs, relative
error about 2^-22), so its tokens are not bit-identical to the eager path's: on a device where
the kernel runs, every sampling call goes through it (the CUDA graph's and the eager ones).

On a CPU the same kernel runs under Triton's interpreter (numpy) when `TRITON_INTERPRET=1` is
set before Triton is imported: tests only (tests/conftest.py sets it where there is no CUDA;
tests/test_engine_fused.py); the CPU sampler itself stays eager (`engine.sampling`).
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from typing import NamedTuple

import torch

from slipstream.engine.devices import on_device

TILE = 2048  # vocabulary entries per program (a multiple of `SUB`)

try:  # Triton comes with CUDA builds of torch on Linux; without it the sampler stays eager
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None


class TileSums(NamedTuple):
    tile_max: torch.Tensor  # [B, T] float32: each tile's largest logit (-inf: none finite)
    tile_arg: torch.Tensor  # [B, T] int64: the vocabulary index of its first largest logit
    full: torch.Tensor  # [B, n] float32: block sums of exp2((x - tile max) log2 e / t)
    kept: torch.Tensor | None  # [B, n] float32: the same over `keep`; None without it


if triton is not None:

    @triton.jit
    def _tile_sums(
        x_ptr,
        x_stride,
        scale_ptr,
        keep_ptr,
        keep_stride,
        full_ptr,
        kept_ptr,
        tmax_ptr,
        targ_ptr,
        V,
        n_blocks,
        n_tiles,
        TILE: tl.constexpr,
        SUB: tl.constexpr,
        NB: tl.constexpr,
        HAS_KEEP: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        tile = tl.program_id(1)
        offs = tile * TILE + tl.arange(0, TILE)
        inside = offs < V
        x = tl.load(x_ptr + row * x_stride + offs, mask=inside, other=-float("inf"))
        x = x.to(tl.float32)
        m, arg = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        s = tl.load(scale_ptr + row)  # log2 e / t
        shift = tl.where(m == -float("inf"), 0.0, m)  # a tile with no finite logit sums 0
        e = tl.exp2((x - shift) * s)  # x - m first: exact near the top, where the mass is
        blocks = tile * NB + tl.arange(0, NB)
        out = row * n_blocks + blocks
        tl.store(full_ptr + out, tl.sum(tl.reshape(e, (NB, SUB)), axis=1), mask=blocks < n_blocks)
        if HAS_KEEP:
            k = tl.load(keep_ptr + row * keep_stride + offs, mask=inside, other=0)
            kept = tl.sum(tl.reshape(tl.where(k != 0, e, 0.0), (NB, SUB)), axis=1)
            tl.store(kept_ptr + out, kept, mask=blocks < n_blocks)
        tl.store(tmax_ptr + row * n_tiles + tile, m)
        tl.store(targ_ptr + row * n_tiles + tile, arg.to(tl.int64) + tile * TILE)


def tile_sums(
    logits: torch.Tensor, scale: torch.Tensor, sub: int, keep: torch.Tensor | None = None
) -> TileSums:
    """One pass over `logits` `[B, V]` (any float dtype, rows contiguous) with each row's
    `log2 e / t` `scale` `[B, 1]`: tile maxima and their indices, and block sums of `sub`
    entries (see the module docstring). `keep` `[B, V]` bool: also the sums over it."""
    if triton is None:
        raise RuntimeError("fused sampling needs Triton (pip install triton)")
    if TILE % sub:
        raise ValueError(f"TILE ({TILE}) must be a multiple of the block size ({sub})")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    B, V = logits.shape
    n_tiles, n_blocks = -(-V // TILE), -(-V // sub)
    dev = logits.device
    if dev.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the fused sampling kernel runs on CPU tensors only under "
                           "TRITON_INTERPRET=1 set before Triton is imported (tests)")  # fmt: skip
    scale = scale.reshape(B).float().contiguous()
    full = torch.empty(B, n_blocks, dtype=torch.float32, device=dev)
    kept = torch.empty_like(full) if keep is not None else None
    tile_max = torch.empty(B, n_tiles, dtype=torch.float32, device=dev)
    tile_arg = torch.empty(B, n_tiles, dtype=torch.int64, device=dev)
    # without `keep`, any pointer stands in: HAS_KEEP is off and it is never read
    keep_arg = keep.contiguous().view(torch.uint8) if keep is not None else full
    keep_stride = keep_arg.stride(0) if keep is not None else 0
    with on_device(dev):  # Triton launches on the current device's stream
        _tile_sums[(B, n_tiles)](
            logits, logits.stride(0), scale, keep_arg, keep_stride, full,
            kept if kept is not None else full, tile_max, tile_arg, V, n_blocks, n_tiles,
            TILE=TILE, SUB=sub, NB=TILE // sub, HAS_KEEP=keep is not None,
        )  # fmt: skip
    return TileSums(tile_max, tile_arg, full, kept)


def available(device: torch.device) -> bool:
    """Whether sampling on `device` goes through the kernel: a CUDA device, Triton installed,
    and the kernel's self-check passed there (once per device; a failure is a warning and the
    sampler stays eager for the process)."""
    if device.type != "cuda" or triton is None:
        return False
    return _self_check(str(device))


@functools.cache
def _self_check(device: str) -> bool:
    """Compiles and runs the kernel on random logits on `device` (bfloat16 and float32) and
    compares with float64 arithmetic: tile maxima and first indices exactly, block sums to
    1e-5 relative (1e-30 absolute: a device may flush subnormal sums to zero)."""
    try:
        gen = torch.Generator().manual_seed(0)
        for dtype in (torch.float32, torch.bfloat16):
            x = (torch.randn(3, 3 * TILE + 77, generator=gen) * 4).to(dtype)
            x[1, 5] = x[1, 9] = 100.0  # a tie: the first index must win
            x[2, :TILE] = float("-inf")  # a tile with no finite logit
            scale = torch.tensor([[1.0], [2.5], [0.7]]) * (1 / math.log(2))
            got = tile_sums(x.to(device), scale.to(device), 128)
            want = reference_tile_sums(x, scale, 128)
            ok = torch.equal(got.tile_max.cpu(), want.tile_max)
            ok &= torch.equal(got.tile_arg.cpu(), want.tile_arg)
            ok &= torch.allclose(got.full.cpu().double(), want.full.double(), rtol=1e-5, atol=1e-30)
            if not ok:
                warnings.warn(f"fused sampling off: its kernel disagrees with float64 on {device}",
                              stacklevel=2)  # fmt: skip
                return False
        return True
    except Exception as e:  # a Triton or driver failure: sample eagerly instead
        warnings.warn(f"fused sampling off on {device}: {type(e).__name__}: {e}", stacklevel=2)
        return False


def reference_tile_sums(
    logits: torch.Tensor, scale: torch.Tensor, sub: int, keep: torch.Tensor | None = None
) -> TileSums:
    """`tile_sums` in float64 torch arithmetic (the exact values the kernel rounds)."""
    B, V = logits.shape
    n_tiles = -(-V // TILE)
    pad = n_tiles * TILE - V
    x = torch.nn.functional.pad(logits.double(), (0, pad), value=float("-inf"))
    tiles = x.view(B, n_tiles, TILE)
    tile_max, arg = tiles.max(dim=-1)
    shift = torch.where(torch.isinf(tile_max) & (tile_max < 0), 0.0, tile_max)
    e = ((tiles - shift[..., None]) * scale.double().view(B, 1, 1)).exp2()
    full = e.view(B, -1, sub).sum(dim=-1)[:, : -(-V // sub)]
    kept = None
    if keep is not None:
        k = torch.nn.functional.pad(keep, (0, pad), value=False).view(B, n_tiles, TILE)
        kept = torch.where(k, e, 0.0).view(B, -1, sub).sum(dim=-1)[:, : -(-V // sub)]
        kept = kept.float()
    offset = torch.arange(n_tiles)[None, :] * TILE
    return TileSums(tile_max.float(), arg + offset, full.float(), kept)
