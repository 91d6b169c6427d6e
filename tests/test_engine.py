"""The engine's invariants: continuous batching changes nothing, in-flight weight updates are
exact, sampling is reproducible, and aborts and groups come out when they should."""

from __future__ import annotations

import pytest
import torch

from slipstream.engine import (
    Completion,
    Engine,
    GroupCollector,
    GroupMember,
    Request,
    SamplingParams,
    rates,
)
from slipstream.engine.admission import PrefillAdmission
from slipstream.engine.sampling import filter_logits, sample
from slipstream.model.llama import CausalLM, ModelConfig
from slipstream.train.batch import collate, token_logprobs
from slipstream.types import FinishReason, Sample

EOS = 1
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


pytestmark = pytest.mark.usefixtures("one_thread")


def _model(seed: int = 0, **over) -> CausalLM:
    """A tiny random Llama; normal(0, 0.5) weights so that next-token choices are not ties."""
    kw = dict(
        vocab_size=13,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    model = CausalLM(ModelConfig(**{**kw, **over}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else 0.5 * torch.randn_like(p))
    return model.eval()


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, 7, (n,), generator=g).tolist()
    return [torch.randint(2, 13, (k,), generator=g).tolist() for k in lens]


def _greedy_reference(model: CausalLM, prompt: list[int], n: int) -> list[int]:
    """Naive greedy decoding: a full forward over the whole sequence for every token."""
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            tok = int(model(torch.tensor([ids]))[0, -1].argmax())
        ids.append(tok)
        if tok == EOS:
            break
    return ids[len(prompt) :]


def _engine(model: CausalLM, slots: int = 4, **kw) -> Engine:
    return Engine(model, EOS, num_slots=slots, max_len=24, **kw)


# ---- continuous batching ----------------------------------------------------------------
@pytest.mark.parametrize(
    "model_over", [{}, {"model_type": "qwen3", "head_dim": 16}, {"model_type": "qwen2"}]
)
def test_greedy_continuous_batching_equals_each_prompt_alone(model_over):
    model = _model(**model_over)
    prompts = _prompts(10)
    # uneven max lengths: slots free at different steps and are refilled mid-flight; the
    # long first and last requests leave free slots inside the live range (ridden over)
    maxes = [12, 3, 1, 5, 2, 7, 4, 1, 9, 12]
    reqs = [Request(p, SamplingParams(0.0, max_new_tokens=m)) for p, m in zip(prompts, maxes)]
    engine = _engine(model, slots=4)
    outs = engine.generate(reqs)
    assert engine.stats.computed_slot_steps > engine.stats.active_slot_steps  # holes ridden over
    for r, c in zip(reqs, outs):
        alone = _engine(model, slots=1).generate([Request(r.prompt_tokens, r.params)])[0]
        assert (
            c.tokens
            == alone.tokens
            == _greedy_reference(model, r.prompt_tokens, r.params.max_new_tokens)
        )
        assert c.finish_reason == (
            FinishReason.STOP if c.tokens[-1] == EOS else FinishReason.LENGTH
        )
    assert any(c.finish_reason == FinishReason.STOP for c in outs)


def test_an_engine_allocates_its_cache_and_packed_weights_at_first_use():
    """The trainer builds an engine it never steps when the samplers run elsewhere: it holds
    neither a KV cache nor packed weight copies until it generates."""
    engine = _engine(_model(), slots=2)
    engine.version = 3  # a version change before any step builds nothing either
    assert engine._kv is None and engine._packed is None
    engine.generate([Request(_prompts(1)[0], SamplingParams(temperature=0.0, max_new_tokens=2))])
    assert engine._kv is not None and engine._packed is not None


def test_sparse_live_slots_are_gathered_and_give_the_same_tokens():
    model = _model(3)
    prompts = _prompts(5, seed=4)
    maxes = [10, 1, 1, 1, 10]  # after step 0 only slots 0 and 4 of 5 live: density below 1/2
    reqs = [
        Request(p, SamplingParams(1.0, max_new_tokens=m), seed=i)
        for i, (p, m) in enumerate(zip(prompts, maxes))
    ]
    engine = Engine(model, eos_id=-1, num_slots=5, max_len=24)
    outs = engine.generate(reqs)
    assert engine.stats.sparse_decode_steps == 9
    for r, c in zip(reqs, outs):
        alone = Engine(model, eos_id=-1, num_slots=1, max_len=24).generate([r])[0]
        assert c.tokens == alone.tokens and len(c.tokens) == r.params.max_new_tokens
        torch.testing.assert_close(
            torch.tensor(c.logp), torch.tensor(alone.logp), atol=1e-5, rtol=0
        )


def test_mixed_and_separate_prefill_give_the_same_tokens():
    model = _model(2)
    reqs = [
        Request(p, SamplingParams(1.0, max_new_tokens=1 + i % 7), seed=i)
        for i, p in enumerate(_prompts(12, seed=3))
    ]
    mixed = _engine(model, slots=4).generate(reqs)
    separate_engine = _engine(model, slots=4, mixed_prefill=False)
    separate = separate_engine.generate(reqs)
    for a, b in zip(mixed, separate):
        assert a.tokens == b.tokens
        torch.testing.assert_close(torch.tensor(a.logp), torch.tensor(b.logp), atol=1e-5, rtol=0)
    s = separate_engine.stats
    assert s.prefill_steps > 1 and s.prefill_s > 0 and s.decode_s > 0


@pytest.mark.parametrize("kv_mode", ["keep", "recompute"])
def test_fixed_shape_decode_step_gives_the_ragged_steps_tokens(kv_mode):
    """`decode_graph` (replayed as a CUDA graph on a GPU; eager here) runs every slot over a
    fixed bucket of cache positions each decode step: the same tokens and log-probs as the
    ragged step, through refills, free slots and a weight swap mid-sequence."""
    reqs = [
        Request(p, SamplingParams(1.0, max_new_tokens=1 + (5 * i) % 17), seed=i)
        for i, p in enumerate(_prompts(12, seed=6))
    ]
    new = _model(1).state_dict()
    outs = {}
    for graph in (False, True):
        engine = _engine(_model(0), slots=4, kv_mode=kv_mode, decode_graph=graph)
        outs[graph] = _run(engine, reqs, swap_at=3, state=new, version=1)
        assert engine.stats.graph_decode_steps == (engine.stats.decode_steps if graph else 0)
    assert engine.stats.decode_steps > 5
    for a, b in zip(outs[False], outs[True]):
        assert a.tokens == b.tokens and a.versions == b.versions
        torch.testing.assert_close(torch.tensor(a.logp), torch.tensor(b.logp), atol=1e-5, rtol=0)
    assert {v for c in outs[True] for v in c.versions} == {0, 1}
    assert max(len(c.request.prompt_tokens) + len(c.tokens) for c in outs[True]) > 16
    step = engine._decode_step  # both buckets of max_len 24 ran: 16 and 24
    assert step.buckets == [16, 24]
    assert (step.bucket(1), step.bucket(16), step.bucket(17)) == (16, 16, 24)
    with pytest.raises(ValueError, match="outside"):
        step.bucket(25)


def test_deferred_prefill_batches_admissions_and_keeps_the_tokens():
    """`defer_prefill` (on with CUDA graphs, where a prefill forward costs several decode
    steps) leaves free slots empty until the decode capacity they waste adds up to one prefill:
    fewer prefills, the same tokens."""
    reqs = [
        Request(p, SamplingParams(1.0, max_new_tokens=1 + (5 * i) % 17), seed=i)
        for i, p in enumerate(_prompts(16, seed=7))
    ]
    plain = _engine(_model(0), slots=4, decode_graph=True)
    deferred = _engine(_model(0), slots=4, decode_graph=True, defer_prefill=True)
    for a, b in zip(plain.generate(reqs), deferred.generate(reqs)):
        assert a.tokens == b.tokens
        torch.testing.assert_close(torch.tensor(a.logp), torch.tensor(b.logp), atol=1e-5, rtol=0)
    assert deferred.stats.deferred_admissions > 0
    assert deferred.stats.prefill_steps < plain.stats.prefill_steps
    # the rule by hand: 2 of 4 slots free waste half a decode step (1 s) per step; a prefill
    # costs 2 s, so the 4th step admits, and the count starts over
    rule = PrefillAdmission(decode_s=1.0, prefill_s=2.0)
    assert [rule.due(2, num_slots=4) for _ in range(5)] == [False, False, False, True, False]


def test_every_admission_starts_the_deferral_count_over():
    """The ski-rental count is of decode capacity left idle *since the last admission*: an
    admission made at once because nothing was decoding starts it over too. It carried the
    count of the previous deferral over, so the next free slot was admitted early."""
    engine = _engine(_model(0), slots=2, decode_graph=True, defer_prefill=True)
    rule = engine.admission
    assert rule is not None
    rule.prefill_s = 1e9  # a prefill that is never worth a deferred admission here
    long = Request(_prompts(1, seed=3)[0], SamplingParams(0.0, max_new_tokens=6), seed=0)
    waits = Request(_prompts(1, seed=4)[0], SamplingParams(0.0, max_new_tokens=2), seed=1)
    engine.add(long)
    engine.step()  # admits `long` (nothing decoding)
    engine.add(waits)
    while engine.waiting:  # deferred while `long` decodes, admitted once it has finished
        engine.step()
    assert engine.stats.deferred_admissions > 0
    assert rule.idle_s == 0.0


@pytest.mark.parametrize(
    ("temperature", "model_over"),
    [
        (1.0, {}),
        (0.7, {}),
        (1.0, {"model_type": "qwen3", "head_dim": 16}),
        (0.7, {"model_type": "qwen2", "tie_word_embeddings": True}),
    ],
)
def test_logprobs_equal_trainer_recompute_under_one_version(temperature, model_over):
    model = _model(1, **model_over)
    prompts = _prompts(9, seed=1)
    params = SamplingParams(temperature=temperature, max_new_tokens=10)
    outs = _engine(model, slots=3).generate(
        Request(p, params, seed=i) for i, p in enumerate(prompts)
    )
    samples = [
        Sample(str(i), c.request.prompt_tokens, c.tokens, c.logp, c.versions, c.finish_reason)
        for i, c in enumerate(outs)
    ]
    batch = collate(samples, [0.0] * len(samples), list(range(len(samples))), pad_id=0)
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch, temperature)
    mask = batch.loss_mask
    assert mask.sum() > 40
    # float32 with a KV cache sums in another order than the full forward: on this repository's
    # CPU the qwen2 case at T = 0.7 differs by 1.1e-5 on a log-prob of -2.45 (it failed at
    # atol=1e-5, rtol=0 before any change here), so the bound is 1e-5 absolute plus 1e-5 relative
    torch.testing.assert_close(logp[mask], batch.behavior_logp[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("decode_graph", [False, True])
def test_refill_hook_tops_up_free_slots_from_the_source(decode_graph):
    model = _model()
    source = [
        Request(p, SamplingParams(0.0, max_new_tokens=1 + i % 4))
        for i, p in enumerate(_prompts(11))
    ]
    asked: list[int] = []

    def refill(n: int) -> list[Request]:
        asked.append(n)
        take = source[:1]  # a trickle: one per call, so refill is asked again next step
        del source[:1]
        return take

    engine = _engine(model, slots=3, refill=refill, decode_graph=decode_graph)
    done: list[Completion] = []
    for _ in range(40):
        done += engine.step()
        assert engine.num_active <= 3
    assert len(done) == 11 and not source and engine.idle()
    assert all(1 <= n <= 3 for n in asked)
    for c in done:
        assert c.tokens == _greedy_reference(model, c.request.prompt_tokens, len(c.tokens))


# ---- in-flight weight updates -------------------------------------------------------------
def _run(
    engine: Engine, reqs: list[Request], swap_at: int, state: dict, version: int
) -> list[Completion]:
    for r in reqs:
        engine.add(r)
    out: list[Completion] = []
    for n in range(100):
        if n == swap_at:
            engine.load_weights(state, version)
        out += engine.step()
        if engine.idle():
            break
    return sorted(out, key=lambda c: reqs.index(c.request))


def test_weight_update_copies_into_existing_storage():
    model, new = _model(0), _model(1)
    engine = _engine(model)
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    engine.load_weights(new.state_dict(), version=7)
    assert engine.version == 0  # takes effect between steps, not at hand-over
    engine.step()
    assert engine.version == 7 and engine.stats.weight_updates == 1
    assert engine.stats.weight_update_s > 0
    for n, p in model.named_parameters():
        assert p.data_ptr() == ptrs[n]
        torch.testing.assert_close(p, new.state_dict()[n], atol=0, rtol=0)
    with pytest.raises(KeyError, match="lacks"):
        engine.load_weights({}, 8)


def test_engine_follows_in_place_updates_of_a_shared_model():
    """The engine's packed weight copies follow the model it shares with a trainer: an
    optimizer step is seen by the next step; a write the version counter misses (`.data`) is
    seen once `engine.version` changes, as the schedules set it after each step."""
    model, target = _model(0), _model(1)
    engine = _engine(model, slots=3)
    reqs = [Request(p, SamplingParams(0.0, max_new_tokens=8)) for p in _prompts(3, seed=5)]

    def check() -> None:
        for c in engine.generate(reqs):
            assert c.tokens == _greedy_reference(model, c.request.prompt_tokens, 8)

    check()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for p, t in zip(model.parameters(), target.parameters()):
        p.grad = p.detach() - t.detach()  # one step of lr 1/2 lands halfway to `target`
    opt.step()
    check()
    with torch.no_grad():
        for p, t in zip(model.parameters(), target.parameters()):
            p.data.copy_(t)  # bypasses the version counter
    engine.version += 1
    check()


@pytest.mark.parametrize("kv_mode", ["keep", "recompute"])
def test_versions_switch_mid_sequence(kv_mode):
    model, new = _model(0), _model(1)
    reqs = [
        Request(p, SamplingParams(1.0, max_new_tokens=12), seed=i)
        for i, p in enumerate(_prompts(6))
    ]
    engine = _engine(model, slots=6, kv_mode=kv_mode)
    outs = _run(engine, reqs, swap_at=4, state=new.state_dict(), version=1)
    # every step samples one token per sequence: steps 0-3 sample 4 tokens under version 0
    for c in outs:
        n0 = min(4, len(c.tokens))
        assert c.versions == [0] * n0 + [1] * (len(c.tokens) - n0)
    live = [c for c in outs if len(c.tokens) > 4]  # in flight at the swap: prompt + 3 re-prefilled
    assert live
    assert engine.stats.recompute_tokens == (
        0 if kv_mode == "keep" else sum(len(c.request.prompt_tokens) + 3 for c in live)
    )


def test_recompute_continuation_equals_fresh_generation_under_new_weights():
    old, new = _model(0), _model(1)
    reqs = [Request(p, SamplingParams(0.0, max_new_tokens=12)) for p in _prompts(5, seed=2)]
    outs = _run(_engine(old, slots=5, kv_mode="recompute"), reqs, 3, new.state_dict(), 1)
    checked = 0
    for r, c in zip(reqs, outs):
        n0 = c.versions.count(0)  # tokens sampled before the swap
        if n0 == len(c.tokens):
            continue
        fresh = _engine(new, slots=1).generate(
            [Request(r.prompt_tokens + c.tokens[:n0], SamplingParams(0.0, max_new_tokens=12 - n0))]
        )[0]
        assert c.tokens[n0:] == fresh.tokens
        checked += 1
    assert checked >= 3


def test_keep_mode_attends_to_old_keys_and_values():
    """After a `keep` swap the next token sees the prefix's keys/values from the old weights:
    compared with the model's own cached forward, run by hand."""
    old, new = _model(0), _model(1)
    prompt = _prompts(1, seed=3)[0]
    outs = _run(
        _engine(_model(0), slots=1, kv_mode="keep"),
        [Request(prompt, GREEDY)],
        2,
        new.state_dict(),
        1,
    )
    c = outs[0]
    n0 = c.versions.count(0)  # steps 0 and 1
    assert n0 == 2 and len(c.tokens) > n0
    seq = prompt + c.tokens[: n0 - 1]  # in the cache at the swap; the last token is fed next
    cache = old.new_cache(1, 32)
    slot = torch.tensor([0])
    with torch.no_grad():
        old(torch.tensor([seq]), positions=torch.arange(len(seq))[None], cache=cache, slots=slot)
        logits = new(
            torch.tensor([[c.tokens[n0 - 1]]]),
            positions=torch.tensor([[len(seq)]]),
            cache=cache,
            slots=slot,
        )
    assert int(logits[0, -1].argmax()) == c.tokens[n0]
    torch.testing.assert_close(
        torch.tensor(c.logp[n0]), logits[0, -1].log_softmax(-1)[c.tokens[n0]], atol=1e-5, rtol=0
    )


# ---- sampling ---------------------------------------------------------------------------
def test_sampling_is_reproducible_and_independent_of_batch_and_slot():
    model = _model()
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    target = Request(_prompts(1, seed=5)[0], params, seed=42)
    alone = _engine(model, slots=1).generate([target])[0]
    others = [Request(p, params, seed=100 + i) for i, p in enumerate(_prompts(5, seed=6))]
    # the target lands in a different slot, next to different neighbours, after a refill
    mixed = _engine(model, slots=3).generate([*others, target])[-1]
    assert mixed.tokens == alone.tokens
    torch.testing.assert_close(
        torch.tensor(mixed.logp), torch.tensor(alone.logp), atol=1e-5, rtol=0
    )
    reseeded = Request(target.prompt_tokens, params, seed=43)
    assert _engine(model, slots=1).generate([reseeded])[0].tokens != alone.tokens


def test_top_k_1_equals_greedy():
    model = _model()
    prompts = _prompts(6, seed=7)
    greedy = _engine(model).generate([Request(p, GREEDY) for p in prompts])
    topk1 = _engine(model).generate(
        [
            Request(p, SamplingParams(1.0, top_k=1, max_new_tokens=12), seed=i)
            for i, p in enumerate(prompts)
        ]
    )
    for g, k in zip(greedy, topk1):
        assert k.tokens == g.tokens
        torch.testing.assert_close(torch.tensor(k.logp), torch.tensor(g.logp), atol=1e-6, rtol=0)


@pytest.mark.parametrize(("top_k", "top_p"), [(1, 1.0), (0, 0.1), (3, 0.5), (12, 1e-6)])
def test_greedy_ignores_top_k_and_top_p(top_k, top_p):
    """Temperature 0 is the argmax whatever the filters (vLLM's rule): a greedy request with
    top-k / top-p gave greedy's tokens but counted as filtering, recording a kept_logmass of a
    distribution it never sampled and keeping every step off the CUDA sampling graph. Now its
    params drop both, and its completion is plain greedy's, log-probs included."""
    params = SamplingParams(0.0, top_p=top_p, top_k=top_k, max_new_tokens=12)
    assert (params.top_k, params.top_p, params.filters) == (0, 1.0, False)
    model = _model()
    prompts = _prompts(4, seed=8)
    plain = _engine(model).generate([Request(p, GREEDY, seed=i) for i, p in enumerate(prompts)])
    got = _engine(model).generate([Request(p, params, seed=i) for i, p in enumerate(prompts)])
    for g, c in zip(plain, got):
        assert c.tokens == g.tokens == _greedy_reference(model, c.request.prompt_tokens, 12)
        assert c.logp == g.logp and c.kept_logmass is None


def test_top_p_keeps_the_nucleus_and_reports_its_mass():
    # p = [0.5, 0.3, 0.15, 0.05]: top_p 0.8 keeps {0, 1} (mass 0.8 reached), 0.81 keeps {0, 1, 2}
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()[None].expand(2, 4)
    kept = filter_logits(logits, torch.tensor([0, 0]), torch.tensor([0.8, 0.81]))
    assert torch.isfinite(kept).tolist() == [[True, True, False, False], [True, True, True, False]]
    n = 4000
    got = sample(
        logits[:1].expand(n, 4),
        torch.ones(n),
        torch.zeros(n, dtype=torch.long),
        torch.full((n,), 0.8),
        torch.arange(n),
        torch.zeros(n, dtype=torch.long),
    )
    freq = torch.bincount(got.tokens, minlength=4) / n
    # drawn from the renormalised nucleus (0.625, 0.375); recorded log-prob of the full softmax
    torch.testing.assert_close(freq, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.03, rtol=0)
    torch.testing.assert_close(got.logp, logits[0].log_softmax(-1)[got.tokens])
    torch.testing.assert_close(got.kept_logmass, torch.full((n,), 0.8).log())


def test_gumbel_sampling_matches_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    n = 8000
    got = sample(
        logits.expand(n, 4),
        torch.full((n,), 0.5),
        torch.zeros(n, dtype=torch.long),
        torch.ones(n),
        torch.arange(n),
        torch.full((n,), 3),
    )
    freq = torch.bincount(got.tokens, minlength=4) / n
    torch.testing.assert_close(freq, (logits[0] / 0.5).softmax(-1), atol=0.02, rtol=0)
    assert got.kept_logmass is None


def test_the_count_of_filtering_slots_follows_admissions_finishes_and_aborts():
    # a graph step replays the sampling graph only while no live slot filters: the engine
    # keeps that count instead of scanning its slots each step; it must match the scan
    model = _model()
    engine = Engine(model, -1, 3, 32)  # eos -1: requests end at their length
    for i, p in enumerate(_prompts(7, seed=3)):
        top_p = 0.9 if i % 2 else 1.0
        engine.add(Request(p, SamplingParams(1.0, top_p=top_p, max_new_tokens=2 + i), seed=i))
    seen = set()
    for n in range(40):
        if n == 3:  # an abort frees a filtering and a plain slot
            engine.abort(lambda c: c.request.seed in (1, 2))
        engine.step()
        live = [s for s in engine.slots if s is not None]
        count = sum(s.kept_logmass is not None for s in live)
        assert engine._num_filtering == count
        seen.add(count)
    assert engine.num_active == 0 and engine._num_filtering == 0 and {0, 1} <= seen


# ---- abort and groups ---------------------------------------------------------------------
@pytest.mark.parametrize("decode_graph", [False, True])
def test_abort_by_staleness_returns_partial_sequences_and_frees_slots(decode_graph):
    model, new = _model(0), _model(1)
    params = SamplingParams(1.0, max_new_tokens=12)
    reqs = [Request([2 + i, 3, 4], params, seed=i, key=i) for i in range(4)]
    engine = Engine(model, -1, 3, 24, decode_graph=decode_graph)  # eos -1: no early stop
    for r in reqs:
        engine.add(r)
    engine.step()
    engine.step()  # 2 tokens each in slots 0-2, request 3 waiting
    engine.load_weights(new.state_dict(), version=2)
    engine.step()  # one token under version 2
    stale = engine.abort(lambda c: engine.version - min(c.versions) > 1)
    assert [c.request.key for c in stale] == [0, 1, 2]
    for c in stale:
        assert c.finish_reason == FinishReason.ABORTED
        assert c.versions == [0, 0, 2] and len(c.tokens) == len(c.logp) == 3
    assert engine.num_active == 0 and engine.stats.aborted == 3
    out = engine.step()  # the waiting request takes a freed slot at once
    assert engine.num_active == 1 and engine.slots[0] is not None and not out
    assert engine.slots[0].request.key == 3
    assert engine.abort(lambda c: False) == []


def test_groups_come_out_the_moment_their_last_member_finishes():
    model = _model()
    collector = GroupCollector(group_size=2)
    # eos_id -1 never comes up, and every step samples one token per sequence (the admission
    # step samples the first from the prompt's logits): a request of m tokens ends in step m - 1
    engine = Engine(model, eos_id=-1, num_slots=4, max_len=24)
    lens = {("a", 0): 2, ("a", 1): 6, ("b", 0): 3, ("b", 1): 3}
    for (g, i), m in lens.items():
        engine.add(
            Request([5, 6, 7], SamplingParams(1.0, max_new_tokens=m), seed=i, key=GroupMember(g, i))
        )
    emitted = []
    for step in range(6):
        for group in collector.add(engine.step()):
            assert [c.request.key.member for c in group] == [0, 1]
            emitted.append((step, group[0].request.key.group))
        assert collector.pending == (1 if 1 <= step <= 4 else 0)  # "a" waits for its long member
    assert emitted == [(2, "b"), (5, "a")]


def test_group_collector_orders_members_and_checks_keys():
    def done(key) -> Completion:
        return Completion(
            Request([1], GREEDY, key=key), [2], [0.0], [0], FinishReason.STOP, 0.0, 0.0
        )

    col = GroupCollector(group_size=3)
    out = col.add([done(("p", 2)), done(("q", 0, 1)), done(("p", 0))])
    assert [[c.request.key for c in g] for g in out] == [[("q", 0, 1)]]  # size from the key
    out = col.add([done(("p", 1))])
    assert [[c.request.key for c in g] for g in out] == [[("p", 0), ("p", 1), ("p", 2)]]
    assert col.pending == 0
    with pytest.raises(ValueError, match="twice"):
        col.add([done(("r", 0)), done(("r", 0))])
    with pytest.raises(ValueError, match="outside"):
        col.add([done(("s", 3))])
    with pytest.raises(ValueError, match="group, member"):
        col.add([done("plain")])
    assert [c.request.key for c in col.drop("r")] == [("r", 0)]


def test_group_collector_leaves_nothing_behind_when_a_first_member_is_refused():
    col = GroupCollector(group_size=2)
    bad = Completion(Request([1], GREEDY, key=("s", 5)), [2], [0.0], [0], FinishReason.STOP, 0, 0)
    with pytest.raises(ValueError, match="outside"):
        col.add([bad])
    assert col.pending == 0 and col.drop("s") == []


# ---- metrics ------------------------------------------------------------------------------
def test_stats_count_tokens_steps_and_active_slots():
    model = _model()
    engine = Engine(model, eos_id=-1, num_slots=2, max_len=24, trace=True)
    for p in _prompts(3):
        engine.add(Request(p, SamplingParams(0.0, max_new_tokens=4)))
    before = engine.stats.snapshot()
    outs: list[Completion] = []
    steps = 0
    while not engine.idle():
        outs += engine.step()
        steps += 1
    s = engine.stats
    assert s.tokens_generated == 12 and s.finished == 3
    assert s.prefill_tokens == sum(len(c.request.prompt_tokens) for c in outs)
    # two requests take steps 0-3 (step 0 only prefills); the third is admitted at step 4
    assert steps == 8 and s.prefill_steps == 2
    assert s.decode_steps == 6 and s.active_slot_steps == 2 * 3 + 1 * 3
    assert [n for _, n in s.active_trace] == [2, 2, 2, 0, 1, 1, 1, 0]
    assert s.prefill_s > 0 and s.decode_s > 0
    m = rates(before, s.snapshot(), seconds=2.0)
    assert m["engine/tokens_per_s"] == 6.0 and m["engine/active_slots_mean"] == 1.5
