"""The inverse-CDF sampler at vocabularies of several chunks: it samples the softmax, a row's
token and log-prob do not depend on its neighbours (filtered, greedy or not), the log-prob is
log softmax(logits / T) of the token, and a token of probability 0 is never drawn. The same for
the one-chunk arithmetic a GPU uses, and `sample_static` (what a CUDA graph captures) gives
exactly its tokens and log-probs."""

from __future__ import annotations

import pytest
import torch

from slipstream.engine.sampling import CHUNK, filter_logits, row_uniform, sample, sample_static

V = 3 * CHUNK + 7  # three full chunks and a short one


def _args(n: int, temp: float = 1.0, top_k: int = 0, top_p: float = 1.0, step: int = 0):
    return (
        torch.full((n,), temp),
        torch.full((n,), top_k, dtype=torch.long),
        torch.full((n,), top_p),
        torch.arange(n),
        torch.full((n,), step, dtype=torch.long),
    )


def _peaked() -> torch.Tensor:
    """Logits with mass spread over chunks: 4 strong entries, one per chunk, and a flat rest."""
    x = torch.full((V,), -2.0)
    for i, v in zip((5, CHUNK + 9, 2 * CHUNK + 100, 3 * CHUNK + 3), (3.0, 2.5, 2.0, 1.5)):
        x[i] = v
    return x


@pytest.mark.slow
def test_draws_follow_the_softmax_across_chunks():
    n, temp = 3000, 0.7
    x = _peaked()
    got = sample(x[None].expand(n, V), *_args(n, temp))
    p = (x.double() / temp).softmax(-1)
    freq = torch.bincount(got.tokens, minlength=V).double() / n
    strong = [5, CHUNK + 9, 2 * CHUNK + 100, 3 * CHUNK + 3]
    torch.testing.assert_close(freq[strong], p[strong], atol=0.03, rtol=0)
    rest = 1 - p[strong].sum()  # the flat entries together
    assert abs((1 - freq[strong].sum()) - rest) < 0.03


def test_the_log_prob_is_the_temperature_softmax_of_the_token():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, V, generator=g) * 4
    for temp in (0.6, 1.0):
        got = sample(x, *_args(8, temp))
        ref = (x.double() / temp).log_softmax(-1).gather(-1, got.tokens[:, None]).squeeze(-1)
        torch.testing.assert_close(got.logp.double(), ref, atol=2e-6, rtol=0)


def test_a_rows_token_does_not_depend_on_its_neighbours():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, V, generator=g) * 3
    temp, k, p, seeds, steps = _args(6, 0.8, step=4)
    alone = [sample(x[i : i + 1], temp[:1], k[:1], p[:1], seeds[i : i + 1], steps[:1]) for i in range(6)]  # fmt: skip
    # the same rows together, with a neighbour filtering (top-p) and a greedy one
    x2 = torch.cat([x, torch.randn(2, V, generator=g)])
    temp2, k2, p2 = torch.cat([temp, torch.tensor([0.8, 0.0])]), torch.cat([k, k[:2]]), torch.cat([p, torch.tensor([0.5, 1.0])])  # fmt: skip
    together = sample(x2, temp2, k2, p2, torch.cat([seeds, seeds[:2]]), torch.cat([steps, steps[:2]]))  # fmt: skip
    assert together.tokens[:6].tolist() == [int(a.tokens) for a in alone]
    assert together.logp[:6].tolist() == [float(a.logp) for a in alone]  # bit for bit
    assert together.kept_logmass is not None and together.kept_logmass[:6].abs().max() == 0


def test_no_token_of_probability_zero_is_ever_drawn():
    x = torch.full((V,), float("-inf"))
    x[[3, CHUNK + 1, 3 * CHUNK + 6]] = torch.tensor([0.0, 30.0, -30.0])  # the last: tiny mass
    n = 300
    got = sample(x[None].expand(n, V), *_args(n))
    assert set(got.tokens.tolist()) <= {3, CHUNK + 1, 3 * CHUNK + 6}
    kept = sample(x[None].expand(n, V), *_args(n, top_k=1))  # only the largest survives
    assert set(kept.tokens.tolist()) == {CHUNK + 1}


def test_a_chunk_far_above_the_first_is_redone_against_its_own_maximum():
    """The shift is the first chunk's largest logit: a later chunk 60 above it at T = 0.6
    overflows float32 (2^(60 log2 e / 0.6) = 2^144 > 2^128) and must be redone (without it
    the row's sum is infinite and its log-prob is not finite), and a row whose first
    chunk has no finite logit shifts by its own largest; both rows keep exact log-probs and
    the same tokens alone as beside ordinary rows."""
    g = torch.Generator().manual_seed(2)
    far = torch.randn(V, generator=g) - 30.0
    far[2 * CHUNK + 5 : 2 * CHUNK + 9] = torch.tensor([30.0, 29.5, 29.0, 28.0])
    empty = torch.randn(V, generator=g)
    empty[:CHUNK] = float("-inf")
    plain = torch.randn(V, generator=g) * 3
    x = torch.stack([far, empty, plain])
    temp, k, p, seeds, steps = _args(3, 0.6, step=2)
    got = sample(x, temp, k, p, seeds, steps)
    assert torch.isfinite(got.logp).all()
    ref = (x.double() / 0.6).log_softmax(-1).gather(-1, got.tokens[:, None]).squeeze(-1)
    torch.testing.assert_close(got.logp.double(), ref, atol=2e-6, rtol=0)
    assert 2 * CHUNK + 5 <= int(got.tokens[0]) < 2 * CHUNK + 9 and int(got.tokens[1]) >= CHUNK
    for i in range(3):
        alone = sample(x[i : i + 1], temp[:1], k[:1], p[:1], seeds[i : i + 1], steps[:1])
        assert (int(alone.tokens), float(alone.logp)) == (int(got.tokens[i]), float(got.logp[i]))


def _mixed(n: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Rows at several temperatures, greedy among them, spread logits, a peaked row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, V, generator=g) * 3
    x[0] = _peaked()
    temp = torch.tensor([0.6, 0.0, 1.0, 0.6, 0.6, 0.0, 1.3, 0.6])[:n]
    seeds = torch.randint(0, 2**31, (n,), generator=g)
    steps = torch.randint(0, 500, (n,), generator=g)
    return x, temp, seeds, steps


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sample_static_is_sample_in_one_chunk_bit_for_bit(seed):
    x, temp, seeds, steps = _mixed(8, seed)
    k, p = torch.zeros(8, dtype=torch.long), torch.ones(8)
    ref = sample(x, temp, k, p, seeds, steps, one_chunk=True)
    got = sample_static(x, temp, seeds, steps)
    assert got.tokens.tolist() == ref.tokens.tolist()
    assert got.logp.tolist() == ref.logp.tolist()  # bit for bit
    assert got.kept_logmass is None
    # all rows greedy, and none: sample skips the draw or the argmax, sample_static never does
    for t in (torch.zeros(8), torch.full((8,), 0.7)):
        a, b = sample(x, t, k, p, seeds, steps, one_chunk=True), sample_static(x, t, seeds, steps)
        assert (a.tokens.tolist(), a.logp.tolist()) == (b.tokens.tolist(), b.logp.tolist())
    assert a.tokens.tolist() != x.argmax(-1).tolist()  # at T = 0.7 not all the argmax
    greedy = sample_static(x, torch.zeros(8), seeds, steps)
    assert greedy.tokens.tolist() == x.argmax(-1).tolist()


def test_row_uniform_is_on_the_32_bit_grid_and_a_function_of_seed_and_step():
    """What the sampler's documented resolution rests on (engine.sampling, "Resolution"): `u`
    is `(k + 0.5) / 2^32` for an integer k, the same for a (seed, step) whatever rows sit
    beside it. A wider `u` fails the first assertion: then update that paragraph."""
    seeds = torch.tensor([0, 1, 2**62, 12345, 12345, 7])
    steps = torch.tensor([0, 7, 3, 0, 1, 2**40])
    u = row_uniform(seeds, steps)
    k = u * 2**32 - 0.5
    assert torch.equal(k, k.round()) and bool(((k >= 0) & (k < 2**32)).all())
    alone = torch.cat([row_uniform(seeds[i : i + 1], steps[i : i + 1]) for i in range(6)])
    assert torch.equal(u, alone) and len(set(u.tolist())) == 6


@pytest.mark.parametrize("one_chunk", [False, True])
def test_greedy_rows_are_the_argmax_whatever_their_filters(one_chunk):
    """Temperature 0 with top-k 1, top-p 0.1, both, or a filtering neighbour: exactly the
    argmax (the first of equal maxima), at the tensor level too, where nothing drops the
    filters (`SamplingParams` does, tests/test_engine.py). A consistency check of the rule."""
    x, _, seeds, steps = _mixed(8, 4)
    x[3, 17] = x[3, 40] = x[3].max() + 1.0  # a tie at the top: the first index is greedy's
    temp = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.8, 0.8])
    k = torch.tensor([1, 0, 5, 1, 0, 0, 3, 0])
    p = torch.tensor([1.0, 0.1, 0.5, 1.0, 1.0, 1e-6, 1.0, 0.3])
    got = sample(x, temp, k, p, seeds, steps, one_chunk=one_chunk)
    assert got.tokens[:6].tolist() == x[:6].argmax(-1).tolist()
    assert int(got.tokens[3]) == 17


@pytest.mark.parametrize("one_chunk", [False, True])
def test_greedy_rows_filters_are_not_computed(one_chunk, monkeypatch):
    """Top-k and top-p set on greedy rows only (raw tensors: `SamplingParams` drops them)
    sent the whole batch through `filter_logits`, a sort of each row, for filters that
    change no greedy token; now only a sampled row's filters are. The tokens and log-probs
    are those of the batch without them, bit for bit."""
    import slipstream.engine.sampling as sampling

    x, _, seeds, steps = _mixed(6, 4)
    temp = torch.tensor([0.0, 0.0, 0.0, 0.7, 1.0, 0.0])
    k, p = torch.tensor([5, 0, 1, 0, 0, 3]), torch.tensor([1.0, 0.2, 0.9, 1.0, 1.0, 1.0])
    plain = sample(
        x, temp, torch.zeros_like(k), torch.ones_like(p), seeds, steps, one_chunk=one_chunk
    )

    def no_filter(*a: object) -> torch.Tensor:
        raise AssertionError("filter_logits called for greedy rows' filters")

    monkeypatch.setattr(sampling, "filter_logits", no_filter)
    got = sample(x, temp, k, p, seeds, steps, one_chunk=one_chunk)
    assert torch.equal(got.tokens, plain.tokens) and torch.equal(got.logp, plain.logp)
    assert got.kept_logmass is None  # no sampled row filters: the log mass kept is all of it


def test_one_chunk_rows_do_not_depend_on_their_neighbours_and_log_probs_are_exact():
    x, temp, seeds, steps = _mixed(8, 3)
    k, p = torch.zeros(8, dtype=torch.long), torch.ones(8)
    got = sample(x, temp, k, p, seeds, steps, one_chunk=True)
    t1 = torch.where(temp > 0, temp, torch.ones_like(temp))
    ref = (x.double() / t1[:, None]).log_softmax(-1).gather(-1, got.tokens[:, None]).squeeze(-1)
    torch.testing.assert_close(got.logp.double(), ref, atol=2e-6, rtol=0)
    # a neighbour that filters (top-p) does not move a row's result, nor does being alone,
    # nor which of sample and sample_static drew it
    p2 = p.clone()
    p2[3] = 0.5
    filt = sample(x, temp, k, p2, seeds, steps, one_chunk=True)
    static = sample_static(x, temp, seeds, steps)
    for i in (0, 1, 2, 4, 5, 6, 7):
        alone = sample_static(x[i : i + 1], temp[i : i + 1], seeds[i : i + 1], steps[i : i + 1])
        want = (int(got.tokens[i]), float(got.logp[i]))
        assert (int(filt.tokens[i]), float(filt.logp[i])) == want
        assert (int(alone.tokens), float(alone.logp)) == want
        assert (int(static.tokens[i]), float(static.logp[i])) == want


@pytest.mark.slow
def test_one_chunk_draws_follow_the_softmax():
    n, temp = 3000, 0.7
    x = _peaked()
    got = sample_static(x[None].expand(n, V), torch.full((n,), temp), torch.arange(n), torch.zeros(n, dtype=torch.long))  # fmt: skip
    p = (x.double() / temp).softmax(-1)
    freq = torch.bincount(got.tokens, minlength=V).double() / n
    strong = [5, CHUNK + 9, 2 * CHUNK + 100, 3 * CHUNK + 3]
    torch.testing.assert_close(freq[strong], p[strong], atol=0.03, rtol=0)


def test_the_engine_samples_graph_steps_through_its_sample_graph_unless_a_row_filters():
    """The routing a GPU engine uses, on the CPU's fixed-shape step: decode-only steps go to
    the engine's sampling graph (here a recording stand-in running `sample_static`, as the
    captured graph does), prefill steps and every step with a filtering row live go to
    `sample`."""
    from slipstream.engine import Engine, Request, SamplingParams
    from test_engine import EOS, _model, _prompts

    engine = Engine(_model(1), EOS, num_slots=3, max_len=24, decode_graph=True)
    calls: list[bool] = []  # per graph-routed step: was a filtering request live?

    def graph(logits: torch.Tensor):
        calls.append(any(s is not None and s.kept_logmass is not None for s in engine.slots))
        return sample_static(logits, engine._temp, engine._seed, engine._ntok)

    engine._sample_graph = graph  # type: ignore[assignment]
    reqs = [Request(p, SamplingParams(0.8, max_new_tokens=6), seed=i) for i, p in enumerate(_prompts(3))]  # fmt: skip
    engine.generate(reqs)
    plain = len(calls)
    assert plain == engine.stats.graph_decode_steps > 0 and not any(calls)
    calls.clear()
    filt = Request(_prompts(1, seed=5)[0], SamplingParams(0.8, top_k=3, max_new_tokens=20))
    engine.generate([filt, *reqs])
    assert not any(calls)  # never while the filtering request was live
    assert len(calls) < engine.stats.graph_decode_steps - plain  # it was live for some steps


def test_top_k_keeps_ties_and_top_p_reads_what_top_k_kept_as_transformers_does() -> None:
    """Before, top-k kept the first k of an unstable sort (top-k 1 over two tied maxima kept
    either, not greedy's) and top-p measured mass over the whole row, not the top-k's."""
    pytest.importorskip("transformers")
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 500, generator=g)
    logits[:, 10] = logits[:, 20] = logits.max(dim=-1).values + 1.0  # tied maxima
    ones = torch.ones(64, dtype=torch.long)
    kept = torch.isfinite(filter_logits(logits, ones, torch.ones(64)))
    assert kept.sum(dim=-1).tolist() == [2] * 64 and kept[:, [10, 20]].all()
    for k, p in [(1, 1.0), (5, 1.0), (40, 0.5), (0, 0.9), (300, 0.95)]:
        want = logits
        if k:
            want = TopKLogitsWarper(k)(None, want)
        if p < 1:
            want = TopPLogitsWarper(p)(None, want)
        got = filter_logits(logits, ones * k, torch.full((64,), p))
        assert torch.equal(torch.isfinite(got), torch.isfinite(want)), (k, p)


@pytest.mark.parametrize(("V", "batches"), [(15, 40), (77, 10)])
def test_a_row_samples_the_same_bits_alone_as_in_any_batch(V: int, batches: int) -> None:
    """Random batches of mixed temperatures and filters, each row sampled again alone: the
    same token and bit-identical log-prob. Before the scratch rows were aligned, vocabularies
    off the vector width (the built-in model's 15) differed on about 1 % of rows."""
    g = torch.Generator().manual_seed(V)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=g)

    for _ in range(batches):
        B = int(torch.randint(2, 40, (), generator=g))
        logits = torch.randn(B, V, generator=g) * float(rand() * 8 + 0.5)
        temp = torch.where(rand(B) < 0.5, 1.0, rand(B) * 1.5 + 0.05)
        top_k = torch.where(rand(B) < 0.3, torch.randint(1, V, (B,), generator=g), 0)
        top_p = torch.where(rand(B) < 0.3, rand(B) * 0.9 + 0.05, 1.0)
        seeds = torch.randint(0, 2**31, (B,), generator=g)
        steps = torch.randint(0, 100, (B,), generator=g)
        for one_chunk in (False, True):
            batch = sample(logits, temp, top_k, top_p, seeds, steps, one_chunk=one_chunk)
            for r in range(B):
                i = slice(r, r + 1)
                alone = sample(logits[i].clone(), temp[i], top_k[i], top_p[i], seeds[i], steps[i],
                               one_chunk=one_chunk)  # fmt: skip
                assert (alone.tokens[0], alone.logp[0]) == (batch.tokens[r], batch.logp[r])


def test_requests_without_a_seed_sample_independently_and_follow_pythons_random_seed() -> None:
    """A request that names no seed gets a fresh one, as vLLM's `seed=None` and `transformers`'
    `generate` draw fresh noise: n unseeded requests for one prompt are n samples, not n
    copies of one. The seed is the next draw of Python's `random`, so a program that seeds it
    samples the same again (a fixed seed still fixes a request's tokens)."""
    import random

    from slipstream.engine import Engine, Request, SamplingParams
    from test_engine import EOS, _model

    model = _model()
    params = SamplingParams(1.0, max_new_tokens=8)

    def completions() -> list[tuple[int, ...]]:
        engine = Engine(model, EOS, num_slots=4, max_len=24)
        return [tuple(c.tokens) for c in engine.generate(Request([2, 3, 4], params) for _ in range(6))]  # fmt: skip

    random.seed(7)
    first = completions()
    assert len(set(first)) > 1  # six samples, not one sample six times
    random.seed(7)
    assert completions() == first
