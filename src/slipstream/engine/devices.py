"""The engine's device made current for the CUDA work that names no device.

Most of torch takes its device from its tensors, but some calls act on the *current* CUDA
device: a Triton kernel launches on the current device's stream (engine.fused), and a CUDA
graph capture begins on the current device with `torch.cuda.graph`'s default capture stream,
which is created once per process on whatever device was current then (engine.forward). An
engine built on `cuda:1` while `cuda:0` is current would launch those on the wrong GPU; the
engine's code runs them under `on_device` instead (a graph's replay is tied to its capture
stream's device by torch itself).
"""

from __future__ import annotations

import contextlib

import torch


def on_device(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """`device` as the current CUDA device for the `with` block (`torch.cuda.device`); nothing
    for a CPU (or other non-CUDA) device."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.device(device)
