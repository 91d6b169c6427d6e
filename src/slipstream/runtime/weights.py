"""The shared-memory weight channel: one writer (the trainer), any number of readers.

The parameters live in one flat shared-memory buffer per dtype (`share_memory_()`), each
parameter a view into it, so a publish is a memcpy per parameter and nothing is pickled after
the processes start. A sequence counter makes it a seqlock:

    writer: seq += 1 (odd) ; copy parameters in ; version = v ; seq += 1 (even)
    reader: s1 = seq (retry while odd) ; copy out ; s2 = seq ; torn unless s1 == s2

The writer never waits for readers; a reader whose copy overlapped a publish retries. A read
lands in the reader's own staging buffer (never in the model directly), so a torn copy can
never reach the engine: the engine copies the staging tensors into its parameters at its next
step (`Engine.load_weights`), between two decode steps.

Ordering: the counter and version are aligned 64-bit words, read and written whole. x86 keeps
stores in order, so a reader that sees the even count sees the data written before it. (On a
weakly ordered CPU this relies on the syscalls and locks around each publish acting as fences.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch


def seqlock_publish(seq: Any, version_cell: Any, version: int, copy_in: Callable[[], None]) -> None:
    """The writer's half of the protocol: `copy_in` runs while the count is odd. `copy_in`
    must return only once its data is visible to readers (a device copy synchronised)."""
    seq.value += 1  # odd: a copy is in progress
    copy_in()
    version_cell.value = version
    seq.value += 1  # even: consistent again


def seqlock_read(
    seq: Any,
    version_cell: Any,
    copy_out: Callable[[], None],
    timeout: float,
    on_torn: Callable[[], None] = lambda: None,
) -> int:
    """The reader's half: run `copy_out` (into the reader's own staging) until one copy
    overlapped no publish; returns the version copied. `copy_out` must have finished
    (device copies synchronised) when it returns, or the second look at the count would
    not cover it. TimeoutError when no consistent copy succeeds within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        s1 = seq.value
        if not s1 & 1:
            version = int(version_cell.value)
            copy_out()
            if seq.value == s1:
                return version
            on_torn()
        if time.monotonic() > deadline:
            raise TimeoutError(f"weight channel: no consistent read within {timeout:.1f}s")
        time.sleep(0.0005)  # a publish is in progress: let the writer finish


class SharedWeights:
    """Implements `channels.WeightChannel` over shared memory; create it in the trainer from
    the model's parameters, hand it to the sampler processes when they start (forked from the fork
    server, it pickles as handles to the same memory)."""

    def __init__(self, params: Mapping[str, torch.Tensor], ctx: Any) -> None:
        self._layout: list[tuple[str, torch.dtype, int, int, tuple[int, ...]]] = []
        sizes: dict[torch.dtype, int] = {}
        for name, p in params.items():
            off = sizes.get(p.dtype, 0)
            self._layout.append((name, p.dtype, off, p.numel(), tuple(p.shape)))
            sizes[p.dtype] = off + p.numel()
        self._flat = {dt: torch.zeros(n, dtype=dt).share_memory_() for dt, n in sizes.items()}
        self._seq = ctx.RawValue("q", 0)
        self._version = ctx.RawValue("q", -1)
        self._views = self._make_views(self._flat)
        self._staging: dict[torch.dtype, torch.Tensor] | None = None
        self.torn_reads = 0  # reads that overlapped a publish and were retried (this process)

    def _make_views(self, flat: Mapping[torch.dtype, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {
            name: flat[dt][off : off + n].view(shape) for name, dt, off, n, shape in self._layout
        }

    def __getstate__(self) -> dict[str, Any]:
        return {
            "layout": self._layout,
            "flat": self._flat,
            "seq": self._seq,
            "version": self._version,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._layout, self._flat = state["layout"], state["flat"]
        self._seq, self._version = state["seq"], state["version"]
        self._views = self._make_views(self._flat)
        self._staging = None
        self.torn_reads = 0

    @property
    def names(self) -> list[str]:
        return [name for name, *_ in self._layout]

    def publish(self, params: Mapping[str, torch.Tensor], version: int) -> float:
        t0 = time.perf_counter()

        def copy_in() -> None:
            with torch.no_grad():
                for name, view in self._views.items():
                    view.copy_(params[name].detach())  # casts to the channel's dtype

        seqlock_publish(self._seq, self._version, version, copy_in)
        return time.perf_counter() - t0

    def version(self) -> int:
        return int(self._version.value)

    def read(self, newer_than: int, timeout: float) -> tuple[dict[str, torch.Tensor], int] | None:
        if self._version.value <= newer_than:
            return None
        if self._staging is None:
            self._staging = {dt: torch.empty_like(f) for dt, f in self._flat.items()}
        staging = self._staging

        def copy_out() -> None:
            for dt, src in self._flat.items():
                staging[dt].copy_(src)

        version = seqlock_read(self._seq, self._version, copy_out, timeout, self._count_torn)
        return self._make_views(staging), version

    def _count_torn(self) -> None:
        self.torn_reads += 1
