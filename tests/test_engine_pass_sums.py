"""The engine's forward-pass sums (engine.stats.PASS_SUMS): what sim.calibrate fits the decode
line `seconds = a + b * rows + e * context` from. Hand-derived counts on a fixed schedule."""

from __future__ import annotations

import torch

from slipstream.engine import Engine, Request, SamplingParams
from slipstream.engine.stats import PASS_SUMS, EngineStats, pass_context
from slipstream.model.llama import CausalLM, ModelConfig
from slipstream.sim.calibrate import PASS_KEYS, context_scale


def _engine(slots: int) -> Engine:
    cfg = ModelConfig(
        vocab_size=13, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return Engine(CausalLM(cfg).eval(), eos_id=-1, num_slots=slots, max_len=64)


def test_pass_context_counts_the_keys_each_row_reads() -> None:
    # decode rows of lengths 5 and 7 read 5 and 7 keys; a 3-token prompt part from position 0
    # reads 1 + 2 + 3, one from position 4 reads 5 + 6 + 7
    assert pass_context([5, 7], []) == 12
    assert pass_context([], [(0, 3)]) == 6
    assert pass_context([5], [(0, 3), (4, 3)]) == 5 + 6 + 18


def test_two_requests_give_the_hand_counted_sums() -> None:
    """Prompts of 3 and 5 tokens, 4 new tokens each (no EOS), both admitted in the first step:
    one prefill forward of 8 rows, then 3 decode forwards of 2 rows each."""
    engine = _engine(slots=2)
    params = SamplingParams(temperature=0.0, max_new_tokens=4)
    engine.generate([Request([2, 3, 4], params, seed=0), Request([2, 3, 4, 5, 6], params, seed=1)])
    s = engine.stats
    assert s.pass_n == 4
    assert s.pass_rows == 8 + 3 * 2
    # prefill: 6 + 15 keys; decode step x (1..3) reads (3 + x) + (5 + x)
    ctx = [21, 10, 12, 14]
    rows = [8, 2, 2, 2]
    assert s.pass_ctx == sum(ctx)
    assert s.pass_rows2 == sum(r * r for r in rows)
    assert s.pass_rows_ctx == sum(r * c for r, c in zip(rows, ctx))
    assert s.pass_ctx2 == sum(c * c for c in ctx)
    assert 0 < s.pass_s <= s.decode_s + s.prefill_s + 1e-9
    assert s.pass_rows_s <= 8 * s.pass_s and s.pass_ctx_s <= 21 * s.pass_s


def test_an_untimed_forward_is_counted_but_not_fitted() -> None:
    s = EngineStats()
    s.account(0.5, 4, 4, 0, None)  # e.g. a step that captured a CUDA graph
    s.account(0.1, 2, 2, 0, 9)
    assert s.decode_steps == 2 and s.pass_n == 1 and s.pass_s == 0.1 and s.pass_ctx == 9


def test_the_calibration_reads_the_names_the_engine_writes() -> None:
    """Consistency check: sim.calibrate spells the keys out (it must not import torch)."""
    assert tuple(f"engine/{k}" for k in PASS_SUMS) == PASS_KEYS


def _step_row(engine: Engine, lens: list[int]) -> dict[str, object]:
    """The step metrics sim.calibrate.context_scale reads, from the engine's own counters."""
    s = engine.stats
    return {
        "completion_lens": lens,
        "engine/prefill_tokens": s.prefill_tokens,
        "engine/pass_rows": s.pass_rows,
        "engine/pass_ctx": s.pass_ctx,
    }


def test_the_simulators_context_count_is_the_engines_for_equal_prompts() -> None:
    """With every prompt of the mean length, the simulator's count of the keys read is the
    engine's exactly (context_scale 1.0): the formula is the engine's bookkeeping, not a fit."""
    engine = _engine(slots=3)
    reqs = [
        Request([2, 3, 4, 5], SamplingParams(temperature=0.0, max_new_tokens=n), seed=i)
        for i, n in enumerate((2, 3, 6))
    ]
    engine.generate(reqs)
    assert context_scale([_step_row(engine, [2, 3, 6])]) == 1.0


def test_longer_prompts_with_longer_completions_read_more_than_the_mean_prompt_says() -> None:
    """Prompts of 2 and 8 tokens with 2 and 8 new tokens: the forwards read 6 + 120 keys (hand
    count: 3 + 3 and 36 + 84), the mean prompt (5) counts 30 + 69 = 99."""
    engine = _engine(slots=2)
    engine.generate(
        [
            Request([2, 3], SamplingParams(temperature=0.0, max_new_tokens=2), seed=0),
            Request([2, 3, 4, 5, 6, 7, 8, 9], SamplingParams(temperature=0.0, max_new_tokens=8)),
        ]
    )
    assert engine.stats.pass_ctx == 126
    assert context_scale([_step_row(engine, [2, 8])]) == 126 / 99
