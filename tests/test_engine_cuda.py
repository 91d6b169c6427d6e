"""The engine on a GPU: the CUDA-graph decode step against the eager one, the trainer and a
naive reference. Skipped where no GPU is present (CI has none); run on one with
`python -m pytest tests/test_engine_cuda.py`."""

from __future__ import annotations

import pytest
import torch

from slipstream.engine import Engine, Request, SamplingParams
from slipstream.train.batch import collate, token_logprobs
from slipstream.types import Sample
from test_engine import EOS, _greedy_reference, _model, _prompts, _run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


def _cuda_model(seed: int = 0, **over):
    return _model(seed, **over).to(CUDA)


def test_decode_graph_and_deferred_prefill_are_the_default_on_cuda():
    engine = Engine(_cuda_model(), EOS, num_slots=4, max_len=24)
    assert engine.decode_graph and engine.defer_prefill
    engine.generate([Request(p, SamplingParams(0.0, max_new_tokens=8)) for p in _prompts(4)])
    assert engine.stats.graph_decode_steps == engine.stats.decode_steps > 0
    assert engine._decode_step._graphs  # captured, not run eagerly


@pytest.mark.parametrize("model_over", [{}, {"model_type": "qwen3", "head_dim": 16}])
def test_graph_greedy_equals_each_prompt_alone_and_the_reference(model_over):
    model, cpu_model = _cuda_model(**model_over), _model(**model_over)
    prompts = _prompts(10)
    maxes = [12, 3, 1, 5, 2, 7, 4, 1, 9, 12]
    reqs = [Request(p, SamplingParams(0.0, max_new_tokens=m)) for p, m in zip(prompts, maxes)]
    outs = Engine(model, EOS, num_slots=4, max_len=24).generate(reqs)
    for r, c in zip(reqs, outs):
        alone = Engine(model, EOS, num_slots=1, max_len=24).generate([r])[0]
        ref = _greedy_reference(cpu_model, r.prompt_tokens, r.params.max_new_tokens)
        assert c.tokens == alone.tokens == ref


@pytest.mark.parametrize("kv_mode", ["keep", "recompute"])
def test_graph_and_eager_steps_agree_through_a_weight_swap(kv_mode):
    reqs = [
        Request(p, SamplingParams(1.0, max_new_tokens=1 + (5 * i) % 17), seed=i)
        for i, p in enumerate(_prompts(12, seed=6))
    ]
    new = _cuda_model(1).state_dict()
    outs = {}
    for graph in (False, True):
        model = _cuda_model(0)
        engine = Engine(model, EOS, 4, 24, kv_mode=kv_mode, decode_graph=graph, defer_prefill=False)  # type: ignore[arg-type]
        outs[graph] = _run(engine, reqs, swap_at=3, state=new, version=1)
    for a, b in zip(outs[False], outs[True]):
        assert a.tokens == b.tokens and a.versions == b.versions
        torch.testing.assert_close(torch.tensor(a.logp), torch.tensor(b.logp), atol=1e-5, rtol=0)
    assert {v for c in outs[True] for v in c.versions} == {0, 1}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_graph_logprobs_equal_trainer_recompute_on_cuda(temperature):
    model = _cuda_model(1)
    params = SamplingParams(temperature=temperature, max_new_tokens=10)
    outs = Engine(model, EOS, num_slots=3, max_len=24).generate(
        Request(p, params, seed=i) for i, p in enumerate(_prompts(9, seed=1))
    )
    samples = [
        Sample(str(i), c.request.prompt_tokens, c.tokens, c.logp, c.versions, c.finish_reason)
        for i, c in enumerate(outs)
    ]
    batch = collate(samples, [0.0] * len(samples), list(range(len(samples))), pad_id=0)
    with torch.no_grad():  # the trainer's recompute, on the CPU
        logp, _ = token_logprobs(_model(1), batch, temperature)
    mask = batch.loss_mask
    assert mask.sum() > 40
    torch.testing.assert_close(logp[mask], batch.behavior_logp[mask], atol=1e-5, rtol=0)


def test_deferred_prefill_on_cuda_admits_in_batches_with_the_same_tokens():
    reqs = [
        Request(p, SamplingParams(1.0, max_new_tokens=1 + (5 * i) % 17), seed=i)
        for i, p in enumerate(_prompts(32, seed=7))
    ]
    plain = Engine(_cuda_model(0), EOS, 4, 24, defer_prefill=False)
    deferred = Engine(_cuda_model(0), EOS, 4, 24)
    for a, b in zip(plain.generate(reqs), deferred.generate(reqs)):
        assert a.tokens == b.tokens
    assert deferred.stats.deferred_admissions > 0
    assert deferred.stats.prefill_steps < plain.stats.prefill_steps


def test_capture_while_another_thread_uses_the_gpu():
    """A trainer thread keeps the GPU busy while the engine captures its graphs in another
    (as the local runtime's sampler threads do): neither fails, the tokens are unchanged."""
    import threading

    reqs = [Request(p, SamplingParams(0.0, max_new_tokens=12)) for p in _prompts(8, seed=9)]
    reference = Engine(_cuda_model(0), EOS, 4, 24, decode_graph=False).generate(reqs)
    stop, errors = threading.Event(), []

    def trainer() -> None:
        x = torch.randn(256, 256, device=CUDA)
        try:
            while not stop.is_set():
                x = torch.tanh(x @ x)
        except Exception as e:  # collected, then asserted empty
            errors.append(e)

    t = threading.Thread(target=trainer)
    t.start()
    try:
        outs = Engine(_cuda_model(0), EOS, 4, 24).generate(reqs)
    finally:
        stop.set()
        t.join()
    assert not errors
    assert [c.tokens for c in outs] == [c.tokens for c in reference]


@pytest.mark.parametrize("fused", [False, True])
def test_sample_graph_equals_eager_sampling_bit_for_bit(fused):
    """The captured sampling (SampleGraph) against `sample` on the same GPU rows, at Qwen2.5's
    vocabulary, through the fused kernel and without it: same tokens and log-probs, and the
    inputs are read at each replay (temperatures, seeds, steps and logits changed in place)."""
    if fused:
        pytest.importorskip("triton")
    from slipstream.engine.forward import SampleGraph
    from slipstream.engine.sampling import sample

    B, V = 64, 151936
    g = torch.Generator(device=CUDA).manual_seed(0)
    logits = torch.randn(B, V, device=CUDA, generator=g) * 3
    temp = torch.tensor([0.6, 0.0, 1.0, 0.8] * (B // 4), device=CUDA)
    seeds = torch.arange(B, device=CUDA) * 7919
    steps = torch.arange(B, device=CUDA) % 5
    graph = SampleGraph(temp, seeds, steps, fused)
    k, p = torch.zeros(B, dtype=torch.long, device=CUDA), torch.ones(B, device=CUDA)
    for round_ in range(3):
        got = graph(logits)
        ref = sample(logits, temp, k, p, seeds, steps, fused=fused)
        assert got.tokens.tolist() == ref.tokens.tolist(), round_
        assert got.logp.tolist() == ref.logp.tolist(), round_
        logits.copy_(torch.randn(B, V, device=CUDA, generator=g) * 3)
        steps += 1
        temp[::3] = 0.9
    assert len(graph._graphs) == 1  # one capture, replayed


def test_graph_sampling_at_temperature_is_the_same_alone_and_beside_a_filtering_row():
    """Engine steps at temperature on a GPU sample through the captured graph; a request's
    tokens are the same alone (one slot) as batched, and a neighbour with top-p (which sends
    the steps it is live in through eager sampling) changes no other request's tokens."""
    model = _cuda_model(2)
    reqs = [
        Request(p, SamplingParams(0.8, max_new_tokens=10), seed=i)
        for i, p in enumerate(_prompts(8, seed=3))
    ]
    engine = Engine(model, EOS, num_slots=4, max_len=24)
    batched = engine.generate(reqs)
    assert engine._sample_graph is not None and engine._sample_graph._graphs
    alone = [Engine(model, EOS, num_slots=1, max_len=24).generate([r])[0] for r in reqs]
    filt = Request(_prompts(1, seed=4)[0], SamplingParams(0.8, top_p=0.5, max_new_tokens=10))
    mixed = Engine(model, EOS, num_slots=4, max_len=24).generate([filt, *reqs])[1:]
    for a, b, c in zip(batched, alone, mixed):
        assert a.tokens == b.tokens == c.tokens
        torch.testing.assert_close(torch.tensor(a.logp), torch.tensor(b.logp), atol=1e-6, rtol=0)
        torch.testing.assert_close(torch.tensor(a.logp), torch.tensor(c.logp), atol=1e-6, rtol=0)


def test_graphs_of_one_pool_reuse_each_other_s_freed_memory():
    """A second graph captured in the same `GraphPool` reuses the block the first's capture
    freed (one capture stream), so the reserved memory does not grow by another
    intermediate; with a stream made per capture it grew by at least one (the CPU test
    checks the stream is shared, test_engine_devices)."""
    from slipstream.engine.forward import GraphPool, capture_graph

    n = 64 * 1024 * 1024  # a 256 MiB float32 intermediate, freed inside each capture
    x = torch.ones(n, device=CUDA)
    pool = GraphPool.on(CUDA)
    capture_graph(lambda: (x * 2).sum(), pool)
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved(CUDA)
    graph, out = capture_graph(lambda: (x * 3).sum(), pool)
    torch.cuda.synchronize()
    assert torch.cuda.memory_reserved(CUDA) - before < n * 4 // 2
    graph.replay()
    assert out.item() == pytest.approx(3 * n, rel=1e-5)
