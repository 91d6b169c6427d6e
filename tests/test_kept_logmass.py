"""Top-k / top-p and the behaviour log-prob: completions and samples carry log Z of the kept
set (`kept_logmass`), and `trainer.behavior_logprobs = "truncated"` turns it into the exact
ratio pi / mu (engine.sampling)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from slipstream.algo import losses
from slipstream.algo.correction import CorrectionSpec
from slipstream.config.train import TrainerConfig
from slipstream.engine import Completion, Request, SamplingParams
from slipstream.train.batch import collate
from slipstream.train.trainer import Trainer
from slipstream.types import FinishReason, Group, Prompt, Sample
from test_engine import GREEDY, _engine, _model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_completions_carry_kept_logmass_only_when_they_filter():
    # top_k 1 keeps only the argmax a, so Z = p(a): the recorded log Z equals the log-prob and
    # the exact behaviour log-prob log p(a) - log Z is 0 (mu(a) = 1); a neighbour that does not
    # filter records nothing, although its batch computes masses
    model = _model()
    reqs = [
        Request([2, 3, 4], SamplingParams(1.0, top_k=1, max_new_tokens=6), seed=0),
        Request([5, 6], SamplingParams(1.0, max_new_tokens=6), seed=1),
        Request([7, 8], SamplingParams(1.0, top_p=0.5, max_new_tokens=6), seed=2),
    ]
    top1, plain, nucleus = _engine(model).generate(reqs)
    assert top1.kept_logmass is not None and len(top1.kept_logmass) == len(top1.tokens)
    torch.testing.assert_close(torch.tensor(top1.kept_logmass), torch.tensor(top1.logp))
    assert plain.kept_logmass is None
    assert nucleus.kept_logmass is not None and len(nucleus.kept_logmass) == len(nucleus.tokens)
    # float32 rounding: where the nucleus keeps one token, log Z and log p are the same number
    # computed two ways (seen 1 ulp apart on another CPU)
    assert all(lp <= z + 1e-6 and z <= 1e-6 for lp, z in zip(nucleus.logp, nucleus.kept_logmass))


def test_a_top_p_that_is_1_in_float32_keeps_all_alone_or_beside_a_filtering_request():
    """0.99999999 is below 1 as a Python float but 1 in the sampler's float32: the request was
    admitted as filtering, got no mass alone (its Sample then refused 6 tokens with 0 masses)
    and masses only on the steps a neighbour filtered."""
    model = _model()
    near = SamplingParams(1.0, top_p=0.99999999, max_new_tokens=6)
    assert not near.filters and SamplingParams(1.0, top_p=0.9999).filters
    alone = _engine(model).generate([Request([5, 6], near, seed=1)])[0]
    neighbour = Request([2, 3, 4], SamplingParams(1.0, top_k=2, max_new_tokens=3), seed=0)
    beside = _engine(model).generate([neighbour, Request([5, 6], near, seed=1)])[1]
    assert alone.kept_logmass is None and beside.kept_logmass is None
    assert alone.tokens == beside.tokens


@pytest.mark.parametrize(
    "bad",
    [
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"temperature": -1.0},
        {"top_p": 1e-46},  # above 0, but 0 in the sampler's float32
        {"temperature": 1e-12},  # the float32 scaling of the logits keeps no token
    ],
)
def test_sampling_params_out_of_range_are_refused_when_made(bad):
    """top_p = 0 dropped every token and raised inside Engine.step, after the forward pass,
    leaving both slots of the batch occupied at position 0; a top_p that is 0 in float32 and
    a temperature of 1e-12 did the same (IndexError in the sampler)."""
    with pytest.raises(ValueError):
        SamplingParams(**bad)
    SamplingParams(temperature=0.0)  # greedy
    SamplingParams(temperature=1e-4, top_p=1e-30)  # the smallest allowed; top_p in float32


def test_a_temperature_at_the_smallest_allowed_still_samples_every_slot():
    """MIN_TEMPERATURE is small enough to stay finite in the sampler: a request at it and a
    neighbour both finish (no IndexError, no broken slot)."""
    from slipstream.engine.request import MIN_TEMPERATURE

    outs = _engine(_model()).generate(
        [
            Request([5, 6], SamplingParams(MIN_TEMPERATURE, max_new_tokens=4), seed=1),
            Request([2, 3], SamplingParams(1.0, max_new_tokens=4), seed=2),
        ]
    )
    assert all(c.tokens and all(math.isfinite(x) for x in c.logp) for c in outs)


def test_scored_samples_carry_the_completions_kept_logmass():
    from slipstream.schedule.sampler import score_group

    class Tok:
        def decode(self, ids: list[int]) -> str:
            return " ".join(map(str, ids))

    class Task:
        def reward(self, prompt: Prompt, completion: str) -> float:
            return 1.0

    def done(mass: list[float] | None) -> Completion:
        req = Request([1], GREEDY, seed=3)
        return Completion(req, [2, 3], [-1.0, -2.0], [0, 0], FinishReason.STOP, 0, 0, mass)

    group = score_group(Tok(), Task(), Prompt("p", "q", "a"), [done([-0.5, -0.1]), done(None)])
    assert [s.kept_logmass_T for s in group.samples] == [[-0.5, -0.1], None]


def _filtered_sample() -> Sample:
    return Sample(
        "p", [3], [4, 5], [math.log(0.4), math.log(0.3)], [0, 0], FinishReason.STOP,
        kept_logmass_T=[math.log(0.8), math.log(0.5)],
    )  # fmt: skip


def test_truncated_behavior_logprobs_give_the_exact_ratio_golden():
    # p(a) = 0.4, 0.3 from kept sets of mass Z = 0.8, 0.5: mu = p / Z = 0.5, 0.6. A trainer
    # whose pi equals p on-policy gets ratio pi / p = 1 with `full`, the true pi / mu = Z =
    # 0.8, 0.5 with `truncated` (ratio_mean 0.65); a sample without masses is left as it is
    s = _filtered_sample()
    plain = Sample("q", [3], [4], [math.log(0.4)], [0], FinishReason.STOP)
    full = collate([s, plain], [1.0, 1.0], [0, 1], pad_id=0)
    exact = collate([s, plain], [1.0, 1.0], [0, 1], pad_id=0, behavior="truncated")
    beh = full.behavior_logp  # pi = p on-policy: the recorded log-probs are the trainer's
    for batch, want in ((full, [1.0, 1.0]), (exact, [0.8, 0.5])):
        ratio = (beh - batch.behavior_logp).exp()[batch.loss_mask]
        torch.testing.assert_close(ratio, torch.tensor([*want, 1.0]))
        out = losses.compute(
            "ppo", beh, batch.behavior_logp, batch.advantages, batch.loss_mask,
            old_logp=beh, correction_spec=CorrectionSpec(high=10.0),
        )  # fmt: skip
        assert out.metrics["correction/weight_mean"].item() == pytest.approx(sum(want, 1.0) / 3)
    with pytest.raises(ValueError, match="behavior"):
        collate([s], [1.0], [0], pad_id=0, behavior="exact")


def test_trainer_behavior_logprobs_setting():
    assert TrainerConfig().behavior_logprobs == "full"  # today's ratios by default
    with pytest.raises(ValidationError, match="behavior_logprobs"):
        TrainerConfig(behavior_logprobs="exact")
    trainer = Trainer(_model(), TrainerConfig(behavior_logprobs="truncated"), 1.0, pad_id=0)
    group = Group(Prompt("p", "q", "a"), [_filtered_sample()], advantages_G=[1.0])
    got = trainer.batch([group]).behavior_logp[0, :2]
    torch.testing.assert_close(got, torch.tensor([0.5, 0.6]).log())
