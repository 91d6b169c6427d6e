"""The trainer's proximal policy (`trainer.proximal`) and rollout correction, end to end on the
built-in model: fresh data gives every mode the same gradient; `recompute` on a stale batch
equals the decoupled gradient written out here; micro-batching never changes the gradient,
also when the correction masks tokens."""

from __future__ import annotations

import copy

import pytest
import torch

from slipstream.algo.correction import CorrectionSpec
from slipstream.config import TrainerConfig
from slipstream.model.builtin import init_builtin
from slipstream.train.batch import token_logprobs
from slipstream.train.trainer import Trainer, resolve_proximal
from slipstream.types import FinishReason, Group, Prompt, Sample

CFG = TrainerConfig(
    lr=1e-3, warmup_steps=0, lr_schedule="constant", grad_clip=1e9, agg="token-mean"
)


def _groups(model, tok, behavior_model=None, version=0, n=3):
    """Groups of 2 samples whose behaviour log-probs are `behavior_model`'s (default: `model`'s,
    i.e. fresh data) at temperature 1, every token of `version`."""
    src = behavior_model or model
    groups = []
    for i in range(n):
        prompt = Prompt(f"p{i}", f"{i}+{i + 1}=", str(2 * i + 1))
        ids = tok.encode(prompt.text)
        samples = []
        for completion in (str(2 * i + 1), str(2 * i + 7) + "0"):
            c = [*tok.encode(completion), tok.eos_id]
            x = torch.tensor([ids + c])
            with torch.no_grad():
                lp = src(x[:, :-1]).float().log_softmax(-1)
            beh = lp[0, len(ids) - 1 :].gather(-1, x[0, len(ids) :, None]).squeeze(-1)
            samples.append(
                Sample(prompt.id, ids, c, beh.tolist(), [version] * len(c), FinishReason.STOP)
            )
        groups.append(Group(prompt, samples, advantages_G=[1.0, -1.0]))
    return groups


def _grads(trainer: Trainer, groups) -> dict[str, torch.Tensor]:
    """The gradient of one step (captured where the optimizer would use it)."""
    captured: dict[str, torch.Tensor] = {}

    def capture(*args, **kwargs):
        for name, p in trainer.model.named_parameters():
            captured[name] = p.grad.clone()

    trainer.opt.step = capture  # type: ignore[method-assign]
    trainer.step(groups)
    return captured


def _trainer(model, tok, proximal: str, cfg=CFG, **kw) -> Trainer:
    return Trainer(copy.deepcopy(model), cfg, 1.0, tok.pad_id, 10, proximal=proximal, **kw)


def _close(a: dict, b: dict, atol: float = 1e-6) -> None:
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=1e-5)


def test_fresh_data_gives_every_mode_the_same_gradient() -> None:
    model, tok = init_builtin(seed=0)
    groups = _groups(model, tok)
    ref = _grads(_trainer(model, tok, "none"), groups)
    for mode in ("recompute", "loglinear"):
        _close(ref, _grads(_trainer(model, tok, mode), groups))


def test_recompute_on_a_stale_batch_is_the_decoupled_gradient() -> None:
    # Behaviour from other weights (a stale sampler). The proximal policy is the trainer's
    # weights, so r = 1 and the gradient is -sum_t min(pi/mu, 2) * A * grad log pi / N.
    model, tok = init_builtin(seed=0)
    stale, _ = init_builtin(seed=1)
    groups = _groups(model, tok, behavior_model=stale)
    trainer = _trainer(model, tok, "recompute")
    got = _grads(trainer, groups)

    ref_model = copy.deepcopy(model)
    full = trainer.batch(groups)
    logp, _ = token_logprobs(ref_model, full, 1.0)
    w = (logp.detach() - full.behavior_logp).exp().clamp(max=2.0)
    adv = full.advantages[:, None].expand_as(logp)
    loss = -(w * adv * logp)[full.loss_mask].sum() / full.loss_mask.sum()
    loss.backward()
    want = {n: p.grad for n, p in ref_model.named_parameters()}
    _close(want, got)
    # and with no proximal policy the same batch gives another gradient (PPO's clip on pi/mu)
    other = _grads(_trainer(model, tok, "none"), groups)
    assert any(not torch.allclose(other[k], got[k], atol=1e-6) for k in got)


def test_recompute_equals_a_separate_no_grad_pass() -> None:
    model, tok = init_builtin(seed=0)
    trainer = _trainer(model, tok, "recompute")
    full = trainer.batch(_groups(model, tok))
    logp, _ = token_logprobs(trainer.model, full, 1.0)
    with torch.no_grad():
        again, _ = token_logprobs(trainer.model, full, 1.0)
    old = trainer._proximal(logp, full)
    assert old is not None and not old.requires_grad
    assert torch.equal(old, again)


@pytest.mark.parametrize("action", ["truncate", "mask"])
def test_micro_batches_do_not_change_the_gradient(action: str) -> None:
    model, tok = init_builtin(seed=0)
    stale, _ = init_builtin(seed=1)
    groups = _groups(model, tok, behavior_model=stale, n=4)
    spec = CorrectionSpec(action=action, high=1.5)
    for agg in ("token-mean", "seq-mean-token-mean", "token-sum-norm"):
        one = CFG.model_copy(update={"agg": agg, "micro_batch_size": 64})
        many = CFG.model_copy(update={"agg": agg, "micro_batch_size": 3})
        kw = {"correction_spec": spec, "max_new_tokens": 8}
        a = _grads(_trainer(model, tok, "recompute", one, **kw), groups)
        b = _grads(_trainer(model, tok, "recompute", many, **kw), groups)
        _close(a, b)


def test_mask_metrics_reach_the_step_metrics() -> None:
    model, tok = init_builtin(seed=0)
    stale, _ = init_builtin(seed=1)
    groups = _groups(model, tok, behavior_model=stale)
    t = _trainer(model, tok, "recompute", correction_spec=CorrectionSpec(action="mask", high=1.2))
    m = t.step(groups)
    assert 0.0 < m["correction/masked_frac"] < 1.0
    assert m["mismatch/kl"] > 0.0 and m["correction/weight_max"] <= 1.2
    assert m["train/tokens"] < m["tokens/trained"]  # masked tokens left the loss


def test_auto_resolves_by_max_lag_and_sampler_numerics() -> None:
    assert resolve_proximal("auto", 0) == "none"
    assert resolve_proximal("auto", 2) == "loglinear"
    assert resolve_proximal("auto", 0, exact_sampler=False) == "recompute"
    assert resolve_proximal("auto", 2, exact_sampler=False) == "loglinear"
    assert resolve_proximal("auto", 0, replay=True) == "loglinear"  # replayed samples are old
    assert resolve_proximal("recompute", 4) == "recompute"
    # truncated behaviour log-probs: only recompute makes pi / mu (= Z on-policy) a weight
    assert resolve_proximal("auto", 0, truncated=True) == "recompute"


def test_truncated_behaviour_log_probs_are_paired_with_recompute_or_refused() -> None:
    """With `behavior_logprobs = "truncated"` the ratio reads the kept mass Z < 1 on-policy:
    as the clipped ratio (none, loglinear) a token of Z = 0.7 and a negative advantage lost
    its gradient. `auto` (the default) resolved to none there."""
    from slipstream.config import ConfigError, load_config
    from slipstream.config.load import truncated_behavior

    base = ['trainer.behavior_logprobs="truncated"', "sampling.top_k=5"]
    cfg = load_config(None, base)
    assert truncated_behavior(cfg) and cfg.trainer.proximal == "auto"
    for extra, said in [
        (['trainer.proximal="none"'], "'truncated' with proximal = 'none'"),
        (['trainer.proximal="loglinear"'], "'truncated' with proximal = 'loglinear'"),
        (['schedule.name="pipeline"'], "proximal = 'auto' on data that can be stale"),
        (["replay.enabled=true"], "on data that can be stale"),
    ]:
        with pytest.raises(ConfigError, match=said):
            load_config(None, [*base, *extra])
    load_config(None, [*base, 'schedule.name="pipeline"', 'trainer.proximal="recompute"'])
    assert not truncated_behavior(load_config(None, [base[0], 'trainer.proximal="none"']))
