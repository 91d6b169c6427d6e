"""Broadcast of flat weight buffers in buckets, every collective under a timeout.

One `dist.broadcast` of a whole 3 GB buffer is one opaque wait: it cannot say how far it got,
it holds a second full-size buffer in NCCL's staging on some paths, and a sampler that died
mid-way turns it into a hang until the process group's own timeout. Cut into buckets of
`BUCKET_BYTES`, each broadcast is issued `async_op=True` and waited on with `timeout_s`: a
peer that stops answering is a `CollectiveTimeout` naming what was being sent and how far it
got, within `timeout_s`, never a hang. Both ends plan the same buckets from the same layout
(`plan_buckets` is pure), so they issue the same sequence of collectives.

The buffers stay where they are: with NCCL both ends hold them on the GPU (the trainer
flattens its parameters on its device, a sampler receives into buffers on its own), so a
publish never goes through host memory.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Hashable, Mapping
from typing import TypeVar

import torch

BUCKET_BYTES = 256 * 2**20
"""Bytes per broadcast: large enough that NCCL runs at bus bandwidth (>= tens of MB), small
enough that a timeout says where a transfer stopped."""


K = TypeVar("K", bound=Hashable)


class CollectiveTimeout(RuntimeError):
    """A collective did not complete within its timeout (a peer died or stopped answering)."""


def plan_buckets(
    sizes: Mapping[K, int], bucket_bytes: int = BUCKET_BYTES
) -> list[tuple[K, int, int]]:
    """`(key, start, stop)` byte ranges covering each buffer of `sizes` in order, each at
    most `bucket_bytes` long (an empty buffer has none)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    return [
        (key, a, min(a + bucket_bytes, n))
        for key, n in sizes.items()
        for a in range(0, n, bucket_bytes)
    ]


def broadcast_buckets(
    flats: Mapping[K, torch.Tensor],
    timeout_s: float,
    what: str,
    src: int = 0,
    bucket_bytes: int = BUCKET_BYTES,
) -> int:
    """Broadcast every byte of `flats` (1-D uint8 buffers, same layout on every rank) from
    `src`, bucket by bucket, in place. Returns the number of collectives issued; raises
    `CollectiveTimeout` naming `what` and the bucket when one does not complete in time."""
    import torch.distributed as dist

    plan = plan_buckets({k: f.numel() for k, f in flats.items()}, bucket_bytes)
    timeout = dt.timedelta(seconds=timeout_s)
    for i, (key, a, b) in enumerate(plan):
        work = dist.broadcast(flats[key][a:b], src=src, async_op=True)
        try:
            done = work.wait(timeout=timeout)
        except RuntimeError as e:  # gloo and NCCL raise on timeout or on a failed peer
            raise CollectiveTimeout(
                f"{what}: bucket {i + 1}/{len(plan)} ({b - a} bytes of {key}) failed or did not "
                f"complete within {timeout_s:.1f}s: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
            ) from None
        if done is False:
            raise CollectiveTimeout(
                f"{what}: bucket {i + 1}/{len(plan)} did not complete within {timeout_s:.1f}s"
            )
    return len(plan)
