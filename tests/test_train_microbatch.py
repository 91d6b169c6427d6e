"""Micro-batches by token budget, and the trainer's step under them and under bfloat16."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from slipstream.config import TrainerConfig
from slipstream.model.llama import CausalLM, ModelConfig
from slipstream.train.microbatch import plan_micro_batches, row_widths
from slipstream.train.trainer import Trainer
from slipstream.types import FinishReason, Group, Prompt, Sample


@given(
    st.lists(st.integers(1, 300), max_size=40),
    st.integers(1, 8),
    st.sampled_from([0, 1, 64, 500, 4096]),
)
def test_plan_covers_every_row_once_within_both_bounds(widths, max_rows, max_tokens):
    plan = plan_micro_batches(widths, max_rows, max_tokens)
    rows = [r for s in plan for r in range(s.start, s.stop)]
    assert rows == list(range(len(widths)))  # consecutive, in order, each row once
    for s in plan:
        n, wide = s.stop - s.start, max(widths[s])
        assert 1 <= n <= max_rows
        assert max_tokens == 0 or n == 1 or n * wide <= max_tokens
    # greedy: no two neighbouring ranges could have been one
    for a, b in itertools.pairwise(plan):
        n = b.stop - a.start
        assert n > max_rows or (max_tokens and n * max(widths[a.start : b.stop]) > max_tokens)


def test_plan_golden():
    # widths sorted as Trainer.batch sorts them; budget 12 padded tokens, at most 3 rows:
    # [2, 3, 3] = 3 x 3 = 9; + 4 would be 4 rows; [4, 5] = 10, + 6 = 18 > 12; [6]; [20] alone
    assert plan_micro_batches([2, 3, 3, 4, 5, 6, 20], 3, 12) == [
        slice(0, 3), slice(3, 5), slice(5, 6), slice(6, 7)
    ]  # fmt: skip
    assert plan_micro_batches([], 3, 12) == []


@given(
    st.lists(st.integers(1, 300), max_size=40),
    st.integers(1, 8),
    st.sampled_from([0, 1, 64, 500, 4096]),
)
def test_packed_plan_bounds_the_sum_of_widths(widths, max_rows, max_tokens):
    plan = plan_micro_batches(widths, max_rows, max_tokens, packed=True)
    rows = [r for s in plan for r in range(s.start, s.stop)]
    assert rows == list(range(len(widths)))
    for s in plan:
        n = s.stop - s.start
        assert 1 <= n <= max_rows
        assert max_tokens == 0 or n == 1 or sum(widths[s]) <= max_tokens
    for a, b in itertools.pairwise(plan):
        n = b.stop - a.start
        assert n > max_rows or (max_tokens and sum(widths[a.start : b.stop]) > max_tokens)


def test_packed_plan_golden():
    # budget 12, at most 8 rows: padded [2, 3, 3] = 9, [4, 5] = 10, [6], [20]; packed the rows
    # cost their widths: [2, 3, 3, 4] = 12, [5, 6] = 11, [20] alone
    widths = [2, 3, 3, 4, 5, 6, 20]
    assert plan_micro_batches(widths, 8, 12) == [
        slice(0, 3), slice(3, 5), slice(5, 6), slice(6, 7)
    ]  # fmt: skip
    assert plan_micro_batches(widths, 8, 12, packed=True) == [
        slice(0, 4), slice(4, 6), slice(6, 7)
    ]  # fmt: skip
    assert plan_micro_batches(widths, 2, 12, packed=True) == [
        slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 7)
    ]  # fmt: skip


def test_packing_trainer_budgets_the_packed_row():
    """With `packing` a micro-batch runs as one row of the sum of its widths: the trainer fills
    each up to the budget, where a padded count (rows x widest) cut it into more."""
    cfg = TrainerConfig(micro_batch_size=64, micro_batch_tokens=30, packing=True)
    t = Trainer(_model(), cfg, temperature=1.0, pad_id=0)
    full = t.batch(_groups())
    widths = row_widths(full.loss_mask)
    assert widths == [3, 5, 7, 7, 7, 8, 8, 11, 12, 14, 14, 15]
    plan = t.micro_batches(full)
    # padded: [3, 5, 7, 7] = 4 x 7, [7, 8, 8], [11, 12], [14, 14], [15]: 5 micro-batches
    assert len(plan_micro_batches(widths, 64, 30)) == 5
    assert [sum(widths[s]) for s in plan] == [29, 27, 26, 29]


def test_row_widths_are_last_loss_position_plus_one():
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.bool)
    assert row_widths(mask) == [3, 4, 1]


def test_batch_sorts_rows_by_the_width_a_micro_batch_keeps():
    """A micro-batch is trimmed to its last loss column (prompt and completion lie end to end,
    right-padded): a row without a model token keeps 1 column whatever its prompt, one ending
    on environment tokens stops at its last model token. Sorted by prompt + completion they
    sat among the widest rows, [3, 8] and [8, 1] in pairs: 32 padded tokens, not 22."""
    prompt = Prompt("p", "", "")

    def sample(p: int, c: int, mask: list[bool] | None = None) -> Sample:
        return Sample(
            "p", [1] * p, [2] * c, [-1.0] * c, [0] * c, FinishReason.STOP, model_mask_T=mask
        )

    rows = [sample(2, 7), sample(10, 0), sample(2, 6, [True, True] + [False] * 4), sample(2, 7)]
    t = Trainer(_model(), TrainerConfig(micro_batch_size=2), temperature=1.0, pad_id=0)
    full = t.batch([Group(prompt, rows, advantages_G=[0.0] * 4)])
    padded = sum(full.slice(s).input_ids[:, :-1].numel() for s in t.micro_batches(full))
    assert padded == 2 * 3 + 2 * 8
    assert row_widths(full.loss_mask) == [1, 3, 8, 8]


def _model() -> CausalLM:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    return CausalLM(cfg)


def _groups() -> list[Group]:
    """3 groups of 4 with ragged prompts (2-5) and completions (1-12), fixed log-probs."""
    g = torch.Generator().manual_seed(0)
    out = []
    for k in range(3):
        prompt = Prompt(f"p{k}", "", "")
        ids = torch.randint(1, 40, (2 + k,), generator=g).tolist()
        samples = []
        for _ in range(4):
            c = int(torch.randint(1, 13, (1,), generator=g))
            toks = torch.randint(1, 40, (c,), generator=g).tolist()
            samples.append(Sample(prompt.id, ids, toks, [-3.7] * c, [0] * c, FinishReason.STOP))
        out.append(Group(prompt, samples, advantages_G=[1.5, -0.5, 0.5, -1.5]))
    return out


def _step_grads(cfg: TrainerConfig, dtype: torch.dtype = torch.float32):
    """The gradient the step hands to AdamW (captured just before `opt.step`), and metrics."""
    model = _model()
    trainer = Trainer(model, cfg, temperature=0.6, pad_id=0, compute_dtype=dtype)
    seen: dict[str, torch.Tensor] = {}
    step = trainer.opt.step

    def capture(*a, **k):
        seen.update({n: p.grad.clone() for n, p in model.named_parameters()})
        return step(*a, **k)

    trainer.opt.step = capture
    return seen, trainer.step(_groups()), trainer


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_token_budget_split_gives_the_gradient_of_one_micro_batch(agg):
    one, m1, _ = _step_grads(TrainerConfig(micro_batch_size=64, agg=agg, grad_clip=1e9))
    split, m2, t = _step_grads(
        TrainerConfig(micro_batch_size=64, micro_batch_tokens=30, agg=agg, grad_clip=1e9)
    )
    full = t.batch(_groups())
    assert len(t.micro_batches(full)) >= 4  # the budget did split the 12 rows
    packed, m3, tp = _step_grads(
        TrainerConfig(
            micro_batch_size=64, micro_batch_tokens=30, packing=True, agg=agg, grad_clip=1e9
        )
    )
    assert len(tp.micro_batches(full)) >= 3  # the budget split the packed rows too
    for name in one:
        scale = max(float(one[name].abs().max()), 1.0)
        assert float((split[name] - one[name]).abs().max()) <= 1e-6 * scale, name
        assert float((packed[name] - one[name]).abs().max()) <= 1e-6 * scale, name
    for m in (m2, m3):
        assert m1["train/loss"] == pytest.approx(m["train/loss"], abs=1e-6)
        assert m1["train/entropy"] == pytest.approx(m["train/entropy"], abs=1e-6)


def test_bfloat16_step_runs_end_to_end_with_float32_master_weights():
    grads, metrics, trainer = _step_grads(TrainerConfig(), torch.bfloat16)
    ref, ref_metrics, _ = _step_grads(TrainerConfig())
    assert metrics["train/skipped"] == 0.0 and trainer.version == 1
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert all(v.dtype == torch.float32 for s in trainer.opt.state.values() for v in s.values())
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads.values())
    # bfloat16 products: the gradient points the same way as float32's
    cos = torch.nn.functional.cosine_similarity(
        torch.cat([g.flatten() for g in grads.values()]),
        torch.cat([g.flatten() for g in ref.values()]),
        dim=0,
    )
    assert cos > 0.99
    assert metrics["train/entropy"] == pytest.approx(ref_metrics["train/entropy"], abs=0.05)
