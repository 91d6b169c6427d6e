"""Mixed precision of the trainer: float32 master weights, bfloat16 compute.

With `model.dtype = bfloat16` the trainer's parameters, gradients and AdamW moments stay
float32 (Micikevicius et al. 2018, "Mixed Precision Training": updates of lr x grad are far
below bfloat16's 8-bit mantissa next to a weight, so bfloat16 master weights would round
most updates away), and the forward and backward products run in bfloat16 under
`torch.autocast`. bfloat16 has float32's exponent range, so no loss scaling is needed.
What leaves the trainer (published weights, checkpoints) is cast to the dtype trained.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from slipstream.model.llama import CausalLM

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""`model.dtype` names and their torch dtypes."""


def parse_dtype(name: str) -> torch.dtype:
    """The torch dtype of a `model.dtype` name; ValueError naming the valid ones."""
    if name not in DTYPES:
        raise ValueError(f"model.dtype: unknown {name!r}; valid: {', '.join(DTYPES)}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16 -> "bfloat16"`, as config.json's `torch_dtype` spells it."""
    return str(dtype).removeprefix("torch.")


@contextlib.contextmanager
def autocast(device: torch.device, compute_dtype: torch.dtype) -> Iterator[None]:
    """Products in `compute_dtype` on `device` (nothing changes for float32)."""
    if compute_dtype == torch.float32:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=compute_dtype):
        yield


def channel_layout(model: CausalLM, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """What the weight channel carries: each parameter's name and shape, floating ones in
    the compute `dtype` (meta tensors: a layout, no memory). A bfloat16 run publishes half
    the bytes of its float32 master weights, cast once in the copy into the channel."""
    return {
        n: torch.empty(p.shape, dtype=dtype if p.is_floating_point() else p.dtype, device="meta")
        for n, p in model.named_parameters()
    }


def make_adamw(
    model: CausalLM, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.99)
) -> torch.optim.AdamW:
    """AdamW over `model`'s parameters with the fused kernel (one launch for every parameter),
    on the CPU too: there it takes 1.4 ms a step for a 1M-parameter model against 8 ms for the
    per-tensor loop (bench/peer_trl.py's harness, one thread). The fused kernel does not bump
    the parameters' version counters, which the in-process engine's packed weights watch
    (engine.packed): `step_adamw` bumps them."""
    return torch.optim.AdamW(
        model.parameters(), lr=lr, weight_decay=weight_decay, betas=betas, fused=True
    )


def step_adamw(opt: torch.optim.Optimizer) -> None:
    """`opt.step()`, then each parameter's version counter moved, as an in-place update does
    (the fused kernel writes the storage without moving it)."""
    opt.step()
    params = [p for g in opt.param_groups for p in g["params"]]
    torch.autograd.graph.increment_version(params)
