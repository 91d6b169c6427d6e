"""The weight channel on one node's GPUs: CUDA IPC handles, the seqlock of `weights.py`.

The trainer keeps one flat buffer per dtype on each GPU that hosts a sampler (on the
trainer's own GPU when they are colocated) and a publish copies its parameters into them
device to device (a peer copy across GPUs), cast to the channel's dtype; nothing goes
through host memory. A sampler process opens the buffer of its own GPU from a CUDA IPC
handle (`cudaIpcOpenMemHandle`, through torch's `rebuild_cuda_tensor`) and reads it into its
own staging buffer on the same GPU. A colocated sampler thus reads the trainer's buffer
where it lies, with one on-device copy; it never reads the live parameters, which the
optimizer rewrites in place while a reader may be copying (the seqlock needs a snapshot
that only `publish` writes).

The protocol is `weights.seqlock_publish` / `seqlock_read`, the same as the shared-memory
channel's, with one addition that device copies need: both ends synchronise their copies
before they look at the count again (a CUDA copy is asynchronous; reading the count right
after launching it would cover nothing).

Handles are plain bytes in the pickled state and are opened at the first `read`, inside the
sampler, after its process has set `CUDA_VISIBLE_DEVICES` (runtime.placement): unpickling
never initialises CUDA. The sender's device index is replaced by the reader's own
(`cuda:0`, the only GPU it sees). `SLIPSTREAM_WEIGHTS_DEVICE` (set with the rest of a
sampler's environment) names which buffer, by the trainer's numbering, is its own.

Buffers may also be on the CPU (`devices=["cpu"]`): the class then shares them as the
shared-memory channel does, which is how its fan-out, version and selection logic is
tested on machines without a GPU.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from slipstream.runtime.weights import seqlock_publish, seqlock_read

ENV_DEVICE = "SLIPSTREAM_WEIGHTS_DEVICE"
_DEVICE_ARG = 6  # index of the device in the args of torch's `rebuild_cuda_tensor`

Layout = list[tuple[str, torch.dtype, int, int, tuple[int, ...]]]


def _layout(params: Mapping[str, torch.Tensor]) -> tuple[Layout, dict[torch.dtype, int]]:
    layout: Layout = []
    sizes: dict[torch.dtype, int] = {}
    for name, p in params.items():
        off = sizes.get(p.dtype, 0)
        layout.append((name, p.dtype, off, p.numel(), tuple(p.shape)))
        sizes[p.dtype] = off + p.numel()
    return layout, sizes


def remap_device(args: Sequence[Any], local_index: int) -> tuple[Any, ...]:
    """torch's `rebuild_cuda_tensor` arguments with the sender's device index replaced by
    the reader's (the same GPU, numbered as the reader's process sees it)."""
    out = list(args)
    out[_DEVICE_ARG] = local_index
    return tuple(out)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class CudaIpcWeights:
    """Implements `channels.WeightChannel` with one buffer set per device in `devices`."""

    def __init__(
        self, params: Mapping[str, torch.Tensor], ctx: Any, devices: Sequence[str]
    ) -> None:
        self._layout, sizes = _layout(params)
        self._bufs: dict[str, dict[torch.dtype, torch.Tensor]] = {}
        for d in dict.fromkeys(devices):  # each device once, in order
            flat = {dt: torch.zeros(n, dtype=dt, device=d) for dt, n in sizes.items()}
            self._bufs[d] = {
                k: v.share_memory_() if v.device.type == "cpu" else v for k, v in flat.items()
            }
        self._seq = ctx.RawValue("q", 0)
        self._version = ctx.RawValue("q", -1)
        self._views = {d: self._make_views(b) for d, b in self._bufs.items()}
        self._handles: dict[str, dict[torch.dtype, tuple[Any, ...]]] = {}
        self._mine: dict[torch.dtype, torch.Tensor] | None = None
        self._staging: dict[torch.dtype, torch.Tensor] | None = None
        self.torn_reads = 0

    def _make_views(self, flat: Mapping[torch.dtype, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {
            name: flat[dt][off : off + n].view(shape) for name, dt, off, n, shape in self._layout
        }

    # ---- pickling: CPU buffers as shared memory, CUDA buffers as IPC handles ---------------
    def __getstate__(self) -> dict[str, Any]:
        from torch.multiprocessing.reductions import reduce_tensor

        cpu = {d: b for d, b in self._bufs.items() if d == "cpu"}
        handles = {
            d: {dt: reduce_tensor(t)[1] for dt, t in b.items()}
            for d, b in self._bufs.items()
            if d != "cpu"
        }
        return {
            "layout": self._layout,
            "cpu": cpu,
            "handles": handles,
            "seq": self._seq,
            "version": self._version,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._layout, self._bufs = state["layout"], dict(state["cpu"])
        self._handles = state["handles"]
        self._seq, self._version = state["seq"], state["version"]
        self._views = {d: self._make_views(b) for d, b in self._bufs.items()}  # CPU ones
        self._mine, self._staging = None, None
        self.torn_reads = 0

    def _own_buffers(self) -> dict[torch.dtype, torch.Tensor]:
        """This reader's buffers: those of `SLIPSTREAM_WEIGHTS_DEVICE` (or the only ones),
        opened from their IPC handles on first use."""
        if self._mine is not None:
            return self._mine
        devices = [*self._bufs, *self._handles]
        want = os.environ.get(ENV_DEVICE) or (devices[0] if len(devices) == 1 else "")
        if want not in devices:
            raise RuntimeError(
                f"weight channel: buffers on {devices}; set {ENV_DEVICE} to one of them (got {want!r})"
            )
        if want in self._bufs:
            self._mine = self._bufs[want]
        else:
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            local = torch.cuda.current_device()  # the only GPU this process sees
            self._mine = {
                dt: rebuild_cuda_tensor(*remap_device(args, local))
                for dt, args in self._handles[want].items()
            }
        return self._mine

    # ---- the WeightChannel protocol ---------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [name for name, *_ in self._layout]

    @property
    def devices(self) -> list[str]:
        return [*self._bufs, *self._handles]

    def publish(self, params: Mapping[str, torch.Tensor], version: int) -> float:
        """Copy `params` into every device's buffers (device to device), then bump the count."""
        t0 = time.perf_counter()

        def copy_in() -> None:
            with torch.no_grad():
                for views in self._views.values():
                    for name, view in views.items():
                        view.copy_(params[name].detach(), non_blocking=True)
                # done on every device involved before the count turns even: the buffers'
                # and the source's (a cross-device copy is queued on either side's stream)
                for d in {*self._bufs, *(str(p.device) for p in params.values())}:
                    _sync(torch.device(d))

        seqlock_publish(self._seq, self._version, version, copy_in)
        return time.perf_counter() - t0

    def version(self) -> int:
        return int(self._version.value)

    def read(self, newer_than: int, timeout: float) -> tuple[dict[str, torch.Tensor], int] | None:
        if self._version.value <= newer_than:
            return None
        src = self._own_buffers()
        if self._staging is None:
            self._staging = {dt: torch.empty_like(f) for dt, f in src.items()}
        staging = self._staging

        def copy_out() -> None:
            for dt, f in src.items():
                staging[dt].copy_(f, non_blocking=True)
            _sync(next(iter(staging.values())).device)

        version = seqlock_read(self._seq, self._version, copy_out, timeout, self._count_torn)
        return self._make_views(staging), version

    def _count_torn(self) -> None:
        self.torn_reads += 1
