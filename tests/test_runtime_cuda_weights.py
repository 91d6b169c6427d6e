"""The CUDA IPC weight channel's logic with CPU buffers: the same seqlock and versions as the
shared-memory channel, the reader's buffer chosen by its environment, the IPC device remap.
(tests/test_pipeline_cuda.py runs it across processes on a GPU.)"""

from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp

from slipstream.runtime.cuda_weights import ENV_DEVICE, CudaIpcWeights, remap_device
from slipstream.runtime.placement import resolve

N = 1 << 20


def _params(v: float) -> dict[str, torch.Tensor]:
    return {"a": torch.full((N,), v), "b": torch.full((3, 5), v, dtype=torch.float64)}


def test_roundtrip_versions_and_cast_to_the_channel_dtype():
    ctx = mp.get_context("spawn")
    layout = {"a": torch.empty(N, dtype=torch.bfloat16, device="meta"), "b": torch.empty(3, 5)}
    w = CudaIpcWeights(layout, ctx, ["cpu"])
    assert w.version() == -1 and w.read(-1, timeout=1.0) is None
    w.publish({"a": torch.full((N,), 1.0 + 2**-12), "b": torch.full((3, 5), 7.0)}, 3)
    state, version = w.read(-1, timeout=1.0)
    assert version == 3 and w.read(3, timeout=1.0) is None
    assert state["a"].dtype == torch.bfloat16 and float(state["a"][0]) == 1.0  # rounded once
    assert bool((state["b"] == 7.0).all()) and state["b"].shape == (3, 5)
    # the reader's copy is its own: a later publish does not change what it holds
    w.publish({"a": torch.zeros(N), "b": torch.zeros(3, 5)}, 4)
    assert float(state["b"][0, 0]) == 7.0


def test_reader_takes_the_buffer_its_environment_names(monkeypatch):
    ctx = mp.get_context("spawn")
    w = CudaIpcWeights(_params(0.0), ctx, ["cpu"])
    w.publish(_params(2.0), 1)
    monkeypatch.setenv(ENV_DEVICE, "cuda:3")
    with pytest.raises(RuntimeError, match=r"buffers on \['cpu'\]; set SLIPSTREAM_WEIGHTS_DEVICE"):
        w.read(-1, timeout=1.0)
    monkeypatch.setenv(ENV_DEVICE, "cpu")
    assert w.read(-1, timeout=1.0)[1] == 1
    # the placement hands each sampler its buffer's name with its visible GPU
    env = resolve("cuda:0", "auto", 2, 3).sampler_env(1, parent_visible="")
    assert env == {"CUDA_VISIBLE_DEVICES": "2", ENV_DEVICE: "cuda:2"}


def test_ipc_args_get_the_readers_device_index():
    # torch's rebuild_cuda_tensor(tensor_cls, size, stride, offset, storage_cls, dtype, DEVICE,
    # handle, size_bytes, offset_bytes, requires_grad, ref_handle, ref_offset, event, sync)
    args = ("T", (4,), (1,), 0, "S", torch.bfloat16, 5, b"h", 8, 0, False, b"r", 0, b"e", True)
    out = remap_device(args, 0)
    assert out[6] == 0 and out[:6] == args[:6] and out[7:] == args[7:]


def test_pickled_state_carries_no_tensor_for_cuda_buffers():
    ctx = mp.get_context("spawn")
    w = CudaIpcWeights(_params(0.0), ctx, ["cpu"])
    state = w.__getstate__()
    assert state["handles"] == {} and set(state["cpu"]) == {"cpu"}


def _writer(weights: CudaIpcWeights, seconds: float) -> None:
    params = _params(0.0)
    v, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        v += 1
        for p in params.values():
            p.fill_(float(v))
        weights.publish(params, v)


@pytest.mark.slow
def test_seqlock_never_yields_a_torn_read_across_processes():
    ctx = mp.get_context("spawn")
    w = CudaIpcWeights(_params(0.0), ctx, ["cpu"])
    writer = ctx.Process(target=_writer, args=(w, 3.0), daemon=True)
    writer.start()
    try:
        start = time.monotonic() + 120.0  # a spawned interpreter imports torch first
        while w.version() < 0 and writer.is_alive() and time.monotonic() < start:
            time.sleep(0.01)
        seen: set[int] = set()
        end, last = time.monotonic() + 8.0, 0
        while writer.is_alive() and time.monotonic() < end:
            got = w.read(last, timeout=5.0)
            if got is None:
                continue
            state, version = got
            for t in state.values():
                assert float(t.min()) == float(t.max()) == version, "torn read"
            seen.add(version)
            last = version
    finally:
        writer.join(timeout=10)
        if writer.is_alive():
            writer.kill()
    assert len(seen) >= 2  # the reader saw the writer move on
