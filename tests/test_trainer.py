"""The trainer: a non-finite step is skipped and leaves weights and optimizer state untouched."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from slipstream.algo.correction import CorrectionSpec
from slipstream.config import TrainerConfig
from slipstream.model.builtin import init_builtin
from slipstream.train.trainer import Trainer
from slipstream.types import FinishReason, Group, Prompt, Sample


def _group(tok, advantages):
    prompt = Prompt("p", "1+2=", "3")
    ids = tok.encode(prompt.text)
    samples = [
        Sample("p", ids, [*tok.encode("3"), tok.eos_id], [-1.0, -1.0], [0, 0], FinishReason.STOP),
        Sample("p", ids, [*tok.encode("4"), tok.eos_id], [-1.0, -1.0], [0, 0], FinishReason.STOP),
    ]
    return Group(prompt, samples, advantages_G=advantages)


def test_non_finite_step_is_skipped_and_changes_nothing():
    model, tok = init_builtin(seed=0)
    trainer = Trainer(model, TrainerConfig(), temperature=1.0, pad_id=tok.pad_id)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # a non-finite gradient (an overflow somewhere in backward), injected on one parameter
    hook = model.model.norm.weight.register_hook(lambda g: g * float("nan"))
    metrics = trainer.step([_group(tok, [1.0, -1.0])])
    hook.remove()
    assert metrics["train/skipped"] == 1.0 and trainer.skipped_steps == 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not trainer.opt.state  # AdamW moments never touched
    # non-finite advantages are dropped token by token (algo.losses), not trained on
    metrics = trainer.step([_group(tok, [float("inf"), float("nan")])])
    assert metrics["train/nonfinite_tokens"] == 4.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    metrics = trainer.step([_group(tok, [1.0, -1.0])])
    assert metrics["train/skipped"] == 0.0 and trainer.version == 3
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_skipped_step_trains_no_token_and_the_learner_counts_them_wasted():
    """A step skipped as non-finite moves no weight, so none of its 4 loss tokens entered a
    gradient: `tokens/trained` is 0 (it was 4) and the learner adds all 4 to `tokens/wasted`,
    so tokens/generated = trained - replayed + wasted still holds (it was short by 4).
    `tokens/computed` is the 4 tokens the step's passes went over, skipped or not."""
    from collections import Counter
    from types import SimpleNamespace

    from slipstream.run.learner import RunLearner

    model, tok = init_builtin(seed=0)
    trainer = Trainer(model, TrainerConfig(), 1.0, tok.pad_id)
    engine = SimpleNamespace(version=0)
    run = SimpleNamespace(
        trainer=trainer, engine=engine, eval_engine=engine, counters=Counter(), ledger=None
    )
    learner = RunLearner(run, defer_eval=False)  # type: ignore[arg-type]
    hook = model.model.norm.weight.register_hook(lambda g: g * float("nan"))
    metrics = learner.train([_group(tok, [1.0, -1.0])])
    hook.remove()
    assert metrics["train/skipped"] == 1.0 and metrics["train/nonfinite_tokens"] == 0.0
    assert metrics["tokens/trained"] == 0.0 and metrics["tokens/computed"] == 4.0
    assert run.counters["tokens/wasted"] == 4
    metrics = learner.train([_group(tok, [1.0, -1.0])])  # a step taken wastes none
    assert metrics["tokens/trained"] == metrics["tokens/computed"] == 4.0
    assert run.counters["tokens/wasted"] == 4 and engine.version == 2


def test_a_skipped_step_logs_the_learning_rate_it_would_have_applied():
    """train/lr of a skipped step holds the watchdog's scale as a taken step's does (it was
    the schedule's rate alone: the metric jumped for the skipped step)."""
    model, tok = init_builtin(seed=0)
    trainer = Trainer(
        model,
        TrainerConfig(lr=1e-3, warmup_steps=0, lr_schedule="constant"),
        temperature=1.0,
        pad_id=tok.pad_id,
    )
    trainer.lr_scale = 0.25  # as the watchdog's tighten sets it (schedule.watchdog)
    hook = model.model.norm.weight.register_hook(lambda g: g * float("nan"))
    skipped = trainer.step([_group(tok, [1.0, -1.0])])
    hook.remove()
    taken = trainer.step([_group(tok, [1.0, -1.0])])
    assert skipped["train/skipped"] == 1.0 and taken["train/skipped"] == 0.0
    assert skipped["train/lr"] == taken["train/lr"] == pytest.approx(0.25e-3)
    assert trainer.opt.param_groups[0]["lr"] == pytest.approx(0.25e-3)


def test_adamw_betas_come_from_the_config():
    model, tok = init_builtin(seed=0)
    default = Trainer(model, TrainerConfig(), temperature=1.0, pad_id=tok.pad_id)
    assert default.opt.param_groups[0]["betas"] == (0.9, 0.99)
    trl = Trainer(model, TrainerConfig(betas=(0.9, 0.999)), temperature=1.0, pad_id=tok.pad_id)
    assert trl.opt.param_groups[0]["betas"] == (0.9, 0.999)


def test_fused_adamw_step_moves_the_version_counters_a_shared_engine_watches():
    """The fused kernel writes parameters without bumping their version counters; the trainer
    bumps them, so the in-process engine's packed copies (engine.packed) see the update."""
    model, tok = init_builtin(seed=0)
    trainer = Trainer(model, TrainerConfig(), temperature=1.0, pad_id=tok.pad_id)
    assert trainer.opt.defaults["fused"]
    before = [p._version for p in model.parameters()]
    trainer.step([_group(tok, [1.0, -1.0])])
    assert all(p._version > v for p, v in zip(model.parameters(), before))


def test_a_batch_without_a_trainable_token_is_a_skipped_step():
    """Episodes that crashed before their first observation have no tokens at all: a batch of
    only those collates (it was an IndexError) and its step changes neither the weights nor
    AdamW's moments (zero gradients would still move them), yet the version advances."""
    model, tok = init_builtin(seed=0)
    trainer = Trainer(model, TrainerConfig(), temperature=1.0, pad_id=tok.pad_id)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    crashed = Sample("p", [], [], [], [], FinishReason.ABORTED)
    metrics = trainer.step(
        [Group(Prompt("p", "1+2=", "3"), [crashed, crashed], advantages_G=[0.0, 0.0])]
    )
    assert metrics["train/skipped"] == 1.0 and metrics["tokens/trained"] == 0.0
    assert trainer.version == 1 and not trainer.opt.state
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # beside a real row, the empty one pads and trains nothing
    metrics = trainer.step(
        [_group(tok, [1.0, -1.0]), Group(Prompt("q", "1=", "1"), [crashed], advantages_G=[0.0])]
    )
    assert metrics["train/skipped"] == 0.0 and metrics["tokens/trained"] == 4.0


def test_lr_schedule_peaks_once_and_reaches_the_floor_on_the_last_step():
    """Step s = version + 1 of T: warm-up `lr s / W` up to s = W, then cosine with progress
    `(s - W) / (T - W)`, so step W is the only one at the peak and step T (the last, `run.steps`)
    is at `lr * lr_min_ratio`. lr 0.5, W 2, T 6, floor 0.05, `c = 0.45 / 2`:
    s=1: 0.25; s=2: 0.5; s=3: 0.05 + c (1 + cos(pi/4)) = 0.4340990; s=4: 0.05 + c = 0.275;
    s=5: 0.05 + c (1 - cos(pi/4)) = 0.1159010; s=6: 0.05."""
    model, tok = init_builtin(seed=0)
    cfg = TrainerConfig(lr=0.5, warmup_steps=2, lr_min_ratio=0.1)
    trainer = Trainer(model, cfg, temperature=1.0, pad_id=tok.pad_id, total_steps=6)
    got = [trainer.lr_at(v) for v in range(6)]
    want = [0.25, 0.5, 0.4340990, 0.275, 0.1159010, 0.05]
    assert got == pytest.approx(want, abs=1e-6)
    # no warm-up: the decay starts with the first step and still ends at the floor
    flat = Trainer(model, cfg.model_copy(update={"warmup_steps": 0}), 1.0, tok.pad_id, 6)
    assert flat.lr_at(5) == pytest.approx(0.05) and flat.lr_at(0) < 0.5


def test_a_row_without_loss_tokens_is_not_a_sequence_of_the_ess_or_vcpo():
    """The sequence ESS (and VCPO's learning-rate scale from it) is over the sequences in the
    loss: an episode that crashed before the model spoke adds no weight `w = 1` to it."""
    model, tok = init_builtin(seed=0)
    cfg = TrainerConfig(vcpo=True, warmup_steps=0, lr_schedule="constant")
    crashed = Sample("p", [], [], [], [], FinishReason.ABORTED)
    empty = Group(Prompt("q", "1=", "1"), [crashed], advantages_G=[0.0])
    alone = Trainer(copy.deepcopy(model), cfg, 1.0, tok.pad_id).step([_group(tok, [1.0, -1.0])])
    both = Trainer(copy.deepcopy(model), cfg, 1.0, tok.pad_id).step(
        [_group(tok, [1.0, -1.0]), empty]
    )
    assert alone["staleness/ess_seq"] < 0.99  # the two rows' weights differ: the ESS sees it
    # equal up to float32 rounding (the padded row changes the forward's batch shape); with
    # the empty row counted the ESS was 0.36 here
    assert both["staleness/ess_seq"] == pytest.approx(alone["staleness/ess_seq"], rel=1e-6)
    assert both["train/lr"] == pytest.approx(alone["train/lr"], rel=1e-6)


def test_a_non_finite_token_is_in_no_staleness_metric_and_its_sequence_keeps_the_rest(
    monkeypatch,
):
    """The ESS and VCPO see the loss's finite tokens (losses.finite_tokens): a sequence is its
    finite tokens, a sequence the loss drops (a nan advantage, no finite token) is none. The
    current log-probs are pinned to -1 so that every value is derived by hand."""
    model, tok = init_builtin(seed=0)
    cfg = TrainerConfig(vcpo=True, lr=1e-3, warmup_steps=0, lr_schedule="constant")
    trainer = Trainer(model, cfg, 1.0, tok.pad_id)
    forward = trainer.logprobs

    def pinned(batch):
        logp, entropy = forward(batch)
        return logp - logp.detach() - 1.0, entropy  # -1 everywhere, the model's gradient

    monkeypatch.setattr(trainer, "logprobs", pinned)
    inf, nan = math.inf, math.nan
    ids = tok.encode("1+2=")
    comp = [*tok.encode("3"), tok.eos_id]

    def sample(beh):
        return Sample("p", ids, comp, beh, [0, 0], FinishReason.STOP)

    samples = [
        sample([-1.5, -inf]),  # log-ratios [0.5, -]: sequence 0.5
        sample([-1.0, -1.0 - math.log(3)]),  # [0, ln 3]: sequence ln 3
        sample([-1.0, -1.0 - math.log(2)]),  # advantage nan: not in the loss
        sample([nan, -inf]),  # no finite token
    ]
    group = Group(Prompt("p", "1+2=", "3"), samples, advantages_G=[1.0, -1.0, nan, 1.0])
    metrics = trainer.step([group])
    assert metrics["train/nonfinite_tokens"] == 5.0 and metrics["train/tokens"] == 3.0
    assert metrics["train/seqs"] == 2.0
    # tokens w = [e^0.5, 1, 3]: (1.648721 + 4)^2 / (3 (2.718282 + 10)) = 31.908052 / 38.154845
    # = 0.836278 (it was 0.844 with the nan-advantage sequence's tokens in)
    assert metrics["staleness/ess_token"] == pytest.approx(0.836278, rel=1e-5)
    # sequences w = [e^0.5, 3]: (1.648721 + 3)^2 / (2 (2.718282 + 9)) = 0.922090 (it was
    # 25 / 26 over [3, 2]: the first sequence inf and dropped, the nan-advantage one in)
    assert metrics["staleness/ess_seq"] == pytest.approx(0.922090, rel=1e-5)
    assert metrics["train/lr"] == pytest.approx(1e-3 * 0.960255, rel=1e-5)  # sqrt(0.922090)


def test_a_step_whose_tokens_the_correction_all_masks_is_skipped():
    """Nothing left in the loss (here the rollout correction masks every token: its weight is
    far above `high`) is a step without a trainable token: AdamW would still move the weights
    through weight decay, so the step is skipped like an empty batch."""
    model, tok = init_builtin(seed=0)
    cfg = TrainerConfig(weight_decay=0.1, warmup_steps=0, lr_schedule="constant")
    spec = CorrectionSpec(action="mask", high=2.0)
    trainer = Trainer(model, cfg, 1.0, tok.pad_id, proximal="recompute", correction_spec=spec)
    group = _group(tok, [1.0, -1.0])
    for s in group.samples:
        s.behavior_logp_T = [-50.0] * len(s.behavior_logp_T)  # w = pi_prox / mu ~ e^20
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = trainer.step([group])
    assert metrics["correction/masked_frac"] == 1.0 and metrics["train/tokens"] == 0.0
    assert metrics["train/skipped"] == 1.0 and trainer.skipped_steps == 1
    assert not trainer.opt.state
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_step_kl_is_accurate_for_a_small_step():
    """k3 `r - 1 - log r` of a tiny step is ~ log_r^2 / 2; in float32 `exp(x) - 1 - x` cancels
    to 0 or to rounding noise 100x too large, which `expm1(x) - x` avoids."""
    model, tok = init_builtin(seed=0)
    trainer = Trainer(model, TrainerConfig(), temperature=1.0, pad_id=tok.pad_id)
    full = trainer.batch([_group(tok, [1.0, -1.0])])
    rows = slice(0, 2)
    after, _ = trainer.logprobs(full.slice(rows))
    mask = full.slice(rows).loss_mask
    shift = torch.tensor([3e-5, -1e-4, 5e-5, -3e-5]).repeat(8)[: int(mask.sum())]
    before = after.detach().clone()
    before[mask] -= shift
    log_r = (after.detach() - before)[mask].double()  # as float32 holds them
    want = float((log_r.exp() - 1 - log_r).mean())
    assert trainer.step_kl(full, [(rows, before)]) == pytest.approx(want, rel=1e-2)


def test_tokens_trained_and_entropy_leave_out_a_non_finite_token(monkeypatch):
    """`tokens/trained` counts the tokens the loss took (`LossOutput.valid`) and
    `train/entropy` is the mean over those same tokens. They were the whole loss mask: a token
    the loss dropped as non-finite was counted as trained, and its entropy (nan here, as a
    non-finite forward gives) made the step's entropy nan."""
    model, tok = init_builtin(seed=0)
    trainer = Trainer(model, TrainerConfig(), 1.0, tok.pad_id)
    forward = trainer.logprobs
    # per loss token, in row order (both rows are as wide: the batch keeps their order)
    entropies = torch.tensor([0.5, math.nan, 1.5, 2.5])

    def pinned(batch):
        logp, entropy = forward(batch)
        mask = batch.loss_mask.bool()
        entropy = torch.zeros_like(entropy).masked_scatter(mask, entropies.to(entropy))
        bad = mask & entropy.isnan()  # the first row's second token: its log-prob is nan too
        return torch.where(bad, math.nan, logp), entropy

    monkeypatch.setattr(trainer, "logprobs", pinned)
    metrics = trainer.step([_group(tok, [1.0, -1.0])])
    assert metrics["train/nonfinite_tokens"] == 1.0
    assert metrics["tokens/trained"] == 3.0  # was 4.0
    assert metrics["train/entropy"] == pytest.approx((0.5 + 1.5 + 2.5) / 3)  # was nan
    assert metrics["train/skipped"] == 0.0


def test_the_learner_counts_the_tokens_the_loss_dropped_as_wasted():
    """The orchestrated loop's learner (as the in-process loop, tests/test_algo_integration.py)
    adds the tokens the step's loss dropped as non-finite to `tokens/wasted`: they are out of
    `tokens/trained`, so tokens/generated = trained - replayed + wasted still holds."""
    from collections import Counter
    from types import SimpleNamespace

    from slipstream.run.learner import RunLearner

    model, tok = init_builtin(seed=0)
    trainer = Trainer(model, TrainerConfig(), 1.0, tok.pad_id)
    engine = SimpleNamespace(version=0)
    run = SimpleNamespace(
        trainer=trainer, engine=engine, eval_engine=engine, counters=Counter(), ledger=None
    )
    group = _group(tok, [1.0, -1.0])
    group.samples[0].behavior_logp_T[1] = -math.inf  # the sampler's log-prob of one token
    metrics = RunLearner(run, defer_eval=False).train([group])  # type: ignore[arg-type]
    assert metrics["tokens/trained"] == 3.0 and run.counters["tokens/wasted"] == 1
    assert engine.version == 1


@pytest.mark.parametrize(
    ("agg", "loss"),
    [
        # TRL's loss_type "grpo": the mean over all 3 rows of the per-row means (-1, 0.5, 0)
        ("seq-mean-token-mean", (-1.0 + 0.5 + 0.0) / 3),  # was / 2: -0.25
        # "dr_grpo": the token sum (-2 + 1 + 0) over rows x max_completion_length
        ("token-sum-norm", (-2.0 + 1.0) / (3 * 8)),  # was / (2 * 8): -0.0625
        ("seq-mean-token-sum", (-2.0 + 1.0) / 3),  # (no TRL twin) was / 2
        # "bnpo": the token sum over the 4 tokens in the loss (TRL's "dapo" divides by all 6)
        ("token-mean", (-2.0 + 1.0) / 4),
    ],
)
def test_mask_loss_keeps_a_truncated_sequence_in_the_sequence_count(monkeypatch, agg, loss):
    """Golden values of TRL's normalisers with `mask_truncated_completions` (its
    `_compute_loss`: the truncated row's loss mask is zero, yet `grpo` averages over every row
    and `dr_grpo` divides by every row times the completion length). Overlong `mask_loss` takes
    the truncated sample out of the group (`filters.without_truncated`), so it was no sequence
    of the step's normaliser. Each token's loss is `-A` here: the log-probs are pinned to the
    behaviour ones, so every ratio is 1."""
    from slipstream.algo.filters import without_truncated

    model, tok = init_builtin(seed=0)
    trainer = Trainer(model, TrainerConfig(agg=agg), 1.0, tok.pad_id, max_new_tokens=8)
    forward = trainer.logprobs

    def pinned(batch):
        logp, entropy = forward(batch)
        return logp - logp.detach() - 1.0, entropy  # -1, as every behaviour log-prob

    monkeypatch.setattr(trainer, "logprobs", pinned)
    ids = tok.encode("1+2=")

    def sample(text, finish):
        comp = tok.encode(text)
        return Sample("p", ids, comp, [-1.0] * len(comp), [0] * len(comp), finish)

    group = Group(
        Prompt("p", "1+2=", "3"),
        [
            sample("3;", FinishReason.STOP),
            sample("4;", FinishReason.STOP),
            sample("12", FinishReason.LENGTH),  # cut at max_new_tokens: its advantage unused
        ],
        advantages_G=[1.0, -0.5, 2.0],
    )
    masked = without_truncated(group)
    assert len(masked.samples) == 2
    metrics = trainer.step([masked])
    assert metrics["train/seqs"] == 2.0 and metrics["tokens/trained"] == 4.0
    assert metrics["train/loss"] == pytest.approx(loss, rel=1e-6)
