"""The shared-memory weight channel: a reader never sees a torn copy."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.multiprocessing as mp

from slipstream.runtime.weights import SharedWeights

N = 1 << 21  # 8 MB of float32 per publish: a copy takes long enough to be interrupted


def _params(v: float) -> dict[str, torch.Tensor]:
    return {"a": torch.full((N,), v), "b": torch.full((3, 5), v, dtype=torch.float64)}


def _writer(weights: SharedWeights, stop: Any, seconds: float) -> None:
    """Publishes versions 1, 2, ... back to back until `stop` is set (or `seconds` pass)."""
    params = _params(0.0)
    v, end = 0, time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < end:
        v += 1
        for p in params.values():
            p.fill_(float(v))
        weights.publish(params, v)


def test_roundtrip_and_versions_in_process():
    ctx = mp.get_context("spawn")
    w = SharedWeights(_params(0.0), ctx)
    assert w.version() == -1 and w.read(-1, timeout=1.0) is None
    w.publish(_params(7.0), 3)
    state, version = w.read(-1, timeout=1.0)
    assert version == 3 and w.version() == 3
    assert (
        bool((state["a"] == 7.0).all())
        and state["b"].dtype == torch.float64
        and state["b"].shape == (3, 5)
    )
    assert w.read(3, timeout=1.0) is None  # nothing newer


def test_seqlock_never_yields_a_torn_read():
    """A writer process publishes version v as tensors filled with v, as fast as it can; every
    read that succeeds must hold one version throughout, equal to the version it reports.

    The writer goes on until the reader has seen 20 versions (or 30 s pass), not for a fixed
    time: on a loaded machine a reader racing a back-to-back writer succeeds rarely, and a
    fixed two-second window sometimes held fewer than 5 successful reads."""
    ctx = mp.get_context("spawn")
    w = SharedWeights(_params(0.0), ctx)
    stop = ctx.Event()
    writer = ctx.Process(target=_writer, args=(w, stop, 60.0), daemon=True)
    writer.start()
    try:
        start = time.monotonic() + 120.0  # a spawned interpreter imports torch first
        while w.version() < 0 and writer.is_alive() and time.monotonic() < start:
            time.sleep(0.01)
        seen: set[int] = set()
        end = time.monotonic() + 30.0
        last = 0
        while len(seen) < 20 and writer.is_alive() and time.monotonic() < end:
            got = w.read(last, timeout=5.0)
            if got is None:
                continue
            state, version = got
            a, b = state["a"], state["b"]
            assert float(a.min()) == float(a.max()) == version, "torn read"
            assert float(b.min()) == float(b.max()) == version, "torn read"
            seen.add(version)
            last = version
    finally:
        stop.set()
        writer.join(timeout=10)
        if writer.is_alive():
            writer.kill()
    assert len(seen) >= 5  # the reader really raced the writer
