"""Bucketed broadcast: the plan both ends follow, and a collective that never completes is a
named error within its timeout (gloo on the CPU; NCCL runs the same code on GPUs)."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp
from hypothesis import given
from hypothesis import strategies as st

from slipstream.runtime.buckets import CollectiveTimeout, broadcast_buckets, plan_buckets


@given(
    st.dictionaries(st.sampled_from("abcd"), st.integers(0, 5000), max_size=4), st.integers(1, 999)
)
def test_plan_covers_each_buffer_in_order_within_the_bucket_size(sizes, bucket):
    plan = plan_buckets(sizes, bucket)
    for key, n in sizes.items():
        mine = [(a, b) for k, a, b in plan if k == key]
        assert [x for a, b in mine for x in range(a, b)] == list(range(n))
        assert all(0 < b - a <= bucket for a, b in mine)
    assert [k for k, *_ in plan] == sorted((k for k, *_ in plan), key=list(sizes).index)


def test_plan_golden():
    # 600 bytes of bf16 and 250 of fp32 in buckets of 256: 256 + 256 + 88, then 250
    assert plan_buckets({"bf16": 600, "fp32": 250}, 256) == [
        ("bf16", 0, 256), ("bf16", 256, 512), ("bf16", 512, 600), ("fp32", 0, 250)
    ]  # fmt: skip
    with pytest.raises(ValueError):
        plan_buckets({"x": 1}, 0)


def _rank(rank: int, init: str, mode: str, out: dict) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        n = 1000
        flats = {
            "a": torch.arange(n, dtype=torch.uint8)
            if rank == 0
            else torch.zeros(n, dtype=torch.uint8),
            "b": torch.full((37,), 7 if rank == 0 else 0, dtype=torch.uint8),
        }
        if mode == "ok":
            out[rank] = broadcast_buckets(flats, 30.0, f"rank {rank}", bucket_bytes=256)
            out[f"sum{rank}"] = int(flats["a"].long().sum() + flats["b"].long().sum())
        elif rank == 1:  # rank 0 never sends: the receiver must give up, naming what it waited for
            try:
                broadcast_buckets(flats, 1.0, "sampler 1: broadcast of v5", bucket_bytes=256)
                out["err"] = "no error"
            except CollectiveTimeout as e:
                out["err"] = str(e)
    finally:
        if mode == "ok" or rank == 1:
            dist.destroy_process_group()


def _run_pair(mode: str) -> dict:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as d, ctx.Manager() as m:
        out = m.dict()
        init = "file://" + os.path.join(d, "store")
        procs = [ctx.Process(target=_rank, args=(r, init, mode, out)) for r in range(2)]
        for p in procs:
            p.start()
        procs[1].join(180)
        procs[0].join(5 if mode != "ok" else 180)
        for p in procs:
            if p.is_alive():
                p.kill()
        return dict(out)


@pytest.mark.slow
def test_bucketed_broadcast_delivers_and_a_silent_peer_times_out():
    out = _run_pair("ok")
    # 1000 bytes in 4 buckets of 256, 37 in 1. arange(1000) wraps as uint8: three cycles of
    # 0..255 (32,640 each) and 0..231 (26,796) = 124,716; plus 37 sevens = 259
    assert out[0] == out[1] == 5
    assert out["sum0"] == out["sum1"] == 124716 + 259
    out = _run_pair("silent")
    assert out["err"].startswith("sampler 1: broadcast of v5: bucket 1/5")
