"""An engine on a GPU that is not the current one: the CUDA work that names no device (a graph
capture's streams, a Triton launch) is run on the engine's device (engine.devices). No GPU is
needed: torch.cuda's calls are replaced by a fake that records the device each one acts on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace

import torch

from slipstream.engine import capacity, forward, fused
from slipstream.engine.devices import on_device


class _FakeCuda:
    """The torch.cuda calls `capture_graph` may make, acting on a current device index (0 at
    first) that `device(...)` changes; each call records the device index it acted on."""

    def __init__(self) -> None:
        self.current = 0
        self.seen: list[tuple[str, int]] = []

    def _index(self, device: torch.device | str | int | None) -> int:
        if device is None:
            return self.current
        d = device if isinstance(device, torch.device) else torch.device(device)
        return self.current if d.index is None else d.index

    @contextlib.contextmanager
    def device(self, device: torch.device) -> Iterator[None]:
        before, self.current = self.current, self._index(device)
        try:
            yield
        finally:
            self.current = before

    def Stream(self, device: torch.device | None = None) -> _FakeStream:
        s = _FakeStream(self._index(device))
        self.seen.append(("stream", s.index))
        return s

    def current_stream(self, device: torch.device | None = None) -> _FakeStream:
        s = _FakeStream(self._index(device))
        self.seen.append(("current_stream", s.index))
        return s

    @contextlib.contextmanager
    def stream(self, s: _FakeStream) -> Iterator[None]:
        self.seen.append(("on_stream", s.index))
        yield

    def CUDAGraph(self) -> SimpleNamespace:
        # (torch replays a graph on its capture stream's device, whatever device is current)
        return SimpleNamespace(replay=lambda: None)

    @contextlib.contextmanager
    def graph(
        self, g: object, pool: object = None, stream: _FakeStream | None = None, **kw: object
    ) -> Iterator[None]:
        # torch.cuda.graph's default capture stream: created once, on the device current then
        # (here: before the engine's, device 0)
        self.seen.append(("capture_stream", stream.index if stream is not None else 0))
        self.seen.append(("capture_begin", self.current))  # capture_begin's device
        yield


class _FakeStream:
    def __init__(self, index: int) -> None:
        self.index = index

    def wait_stream(self, other: _FakeStream) -> None:
        assert other.index == self.index


def test_a_graph_is_captured_on_the_engine_s_device_not_the_current_one(monkeypatch):
    """An engine on cuda:1 with cuda:0 current: its sampling graph's capture (and every
    stream it uses) is cuda:1's. Before, `capture_graph` made its side stream with
    `torch.cuda.Stream()`, waited on `current_stream()` and captured on `torch.cuda.graph`'s
    default stream, all cuda:0's, and captured with cuda:0 current."""
    fake = _FakeCuda()
    for name in ("device", "Stream", "current_stream", "stream", "CUDAGraph", "graph"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, 1))
    runs: list[int] = []

    def sample_static(logits: object, *inputs: object, fused: bool) -> str:
        runs.append(fake.current)
        return "sampled"

    monkeypatch.setattr(forward, "sample_static", sample_static)
    # logits of an engine on cuda:1 (only what SampleGraph reads of them)
    logits = SimpleNamespace(device=torch.device("cuda:1"), shape=(4, 10), data_ptr=lambda: 7)
    graph = forward.SampleGraph(torch.ones(4), torch.zeros(4), torch.zeros(4), fused=False)
    assert graph(logits) == "sampled"  # type: ignore[arg-type]
    assert runs == [1, 1, 1]  # two warm-ups and the capture, with cuda:1 current
    assert fake.seen and all(index == 1 for _what, index in fake.seen), fake.seen
    assert fake.current == 0  # the caller's device is current again
    pool = forward.GraphPool.on(torch.device("cuda:1"))
    assert forward.capture_graph(lambda: fake.current, pool)[1] == 1


def test_graphs_of_one_pool_are_captured_on_one_stream(monkeypatch):
    """The caching allocator reuses a freed block only on the stream that freed it: graphs
    sharing a memory pool must be captured on one stream to share its memory. Before, each
    capture made its own side stream, so every bucket's graph kept its intermediates apart
    (outside the engine's memory budget)."""
    fake = _FakeCuda()
    for name in ("device", "Stream", "current_stream", "stream", "CUDAGraph"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    handles = iter(range(1, 100))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, next(handles)))
    captured: list[tuple[object, object]] = []

    @contextlib.contextmanager
    def graph(
        g: object, pool: object = None, stream: object = None, **kw: object
    ) -> Iterator[None]:
        captured.append((pool, stream))
        yield

    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(forward, "sample_static", lambda *a, fused: "sampled")
    sampler = forward.SampleGraph(torch.ones(4), torch.zeros(4), torch.zeros(4), fused=False)
    for ptr in (7, 8, 9):  # three logits buffers (three span buckets): three graphs
        logits = SimpleNamespace(
            device=torch.device("cuda:1"), shape=(4, 10), data_ptr=lambda p=ptr: p
        )
        assert sampler(logits) == "sampled"  # type: ignore[arg-type]
    assert len(captured) == 3
    assert len({pool for pool, _ in captured}) == 1  # one pool
    assert len({id(stream) for _, stream in captured}) == 1  # and one capture stream
    assert sum(what == "stream" for what, _ in fake.seen) == 1  # made once, with the pool


def test_the_fused_kernel_launches_with_its_tensors_device_current(monkeypatch):
    """Triton launches on the current device's stream: before, the sampling kernel of an engine
    on cuda:1 was launched on cuda:0 with cuda:1's pointers. The launch now runs under
    `on_device(logits.device)` (CPU tensors here, so the fake records that device)."""
    entered: list[torch.device] = []
    inside: list[bool] = []

    @contextlib.contextmanager
    def record(device: torch.device) -> Iterator[None]:
        entered.append(device)
        inside.append(True)
        yield
        inside.append(False)

    class _Kernel:
        def __getitem__(self, grid: tuple[int, int]) -> object:
            return lambda *args, **kw: inside.append(inside[-1] if inside else False)

    monkeypatch.setattr(fused, "on_device", record)
    monkeypatch.setattr(fused, "_tile_sums", _Kernel())
    monkeypatch.setattr(fused, "triton", object())
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    fused.tile_sums(torch.zeros(2, 10), torch.ones(2, 1), 128)
    assert entered == [torch.device("cpu")]
    assert inside == [True, True, False]  # entered, launched inside, left


def test_on_device_makes_a_cuda_device_current_and_leaves_the_cpu_alone():
    ctx = on_device(torch.device("cuda:1"))
    assert isinstance(ctx, torch.cuda.device) and ctx.idx == 1
    assert isinstance(on_device(torch.device("cpu")), contextlib.nullcontext)


def test_free_memory_is_measured_on_the_engine_s_device(monkeypatch):
    """A guard (it held before): the KV budget's free memory is the engine's GPU's, which
    `mem_get_info` without a device would take from the current one."""
    asked: list[object] = []

    def mem_get_info(device: object = None) -> tuple[int, int]:
        asked.append(device)
        return 123, 456

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    assert capacity.free_device_bytes(torch.device("cuda:1")) == 123
    assert asked == [torch.device("cuda:1")]
    assert capacity.free_device_bytes(torch.device("cpu")) is None
