"""The algorithm library wired into the loop: config names, dynamic sampling, the pass-rate band,
adaptive group size, replay, overlong shaping and masking, and exact token accounting.

Most tests drive `Run.collect` / `Run.settle` with a scripted engine (no model): each prompt
lists the completions its samples produce, so every count below is known in advance.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest
import torch

from slipstream.algo import losses
from slipstream.config import ConfigError, load_config
from slipstream.engine import Completion, Request
from slipstream.run.components import make_pass_rate_tracker
from slipstream.run.setup import Run
from slipstream.run.sync import train_sync
from slipstream.schedule.pass_rate import PassRateTracker
from slipstream.schedule.replay import ReplayBuffer
from slipstream.tasks import RunningSums
from slipstream.train.batch import collate
from slipstream.types import FinishReason, Group, Prompt
from tiny import warm_cache

STOP, LENGTH = FinishReason.STOP, FinishReason.LENGTH


# ---- config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ['filters.overlong="clip"'],
            "filters.overlong: Input should be 'off', 'mask', 'mask_loss' or 'penalty'",
        ),
        (
            ["filters.max_extra_draws=-1"],
            "filters.max_extra_draws: Input should be greater than or equal to 0",
        ),
        (["replay.enable=true"], "unknown key 'replay.enable' (did you mean 'replay.enabled'?)"),
        (["replay.per_group=0"], "replay.per_group: Input should be greater than or equal to 1"),
        (
            ["sampling.group_size_max=0"],
            "sampling.group_size_max: Input should be greater than or equal to 1",
        ),
        (
            ["filters.dynamic_sampling=true", "filters.zero_variance=false"],
            "filters.dynamic_sampling: needs filters.zero_variance = true",
        ),
        (
            ["sampling.adaptive_group_size=true", "sampling.group_size=40"],
            "sampling.group_size_min: adaptive group size needs group_size_min <= group_size <= group_size_max",
        ),
        (
            [
                "sampling.adaptive_group_size=true",
                "sampling.group_size_min=1",
                'trainer.advantage="rloo"',
            ],
            "sampling.group_size_min: rloo needs groups of at least 2",
        ),
        (
            ['filters.overlong="penalty"', "filters.overlong_cache=65"],
            "filters.overlong_cache: must be at most sampling.max_new_tokens (64)",
        ),
        (
            ["trainer.loss=foo"],
            "trainer.loss: unknown 'foo'; valid: reinforce, ppo, dapo, cispo, dro, gspo, oapl",
        ),
        (
            ["trainer.advantage=bar"],
            "trainer.advantage: unknown 'bar'; valid: grpo, dr_grpo, rloo, maxrl, oapl",
        ),
        (["trainer.agg=mean"], "trainer.agg: unknown 'mean'; valid: token-mean"),
    ],
)
def test_bad_algorithm_config_is_one_clear_line(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_new_algorithm_knobs_are_off_by_default():
    cfg = load_config()
    assert (cfg.filters.dynamic_sampling, cfg.filters.overlong, cfg.replay.enabled) == (
        False,
        "off",
        False,
    )
    assert not cfg.sampling.adaptive_group_size and cfg.task.max_train_prompts is None


# ---- a scripted engine -------------------------------------------------------------------------


class CharTok:
    eos_id, pad_id = 0, 0

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        return self.encode(prompt.text)

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


class Verifier:
    """Reward 1 when the completion, without its trailing 'x' padding, is the answer."""

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 1.0 if completion.rstrip("x") == prompt.answer else 0.0


@dataclass
class CycleSource:
    prompts: list[Prompt]
    index: int = 0

    def draw(self) -> Prompt:
        p = self.prompts[self.index % len(self.prompts)]
        self.index += 1
        return p


@dataclass
class ScriptedEngine:
    """Sample g of prompt p is `p.meta["outs"][g % len]`: (text, finish reason)."""

    version: int = 0
    requests: list[Request] = field(default_factory=list)

    def generate(self, requests: Iterable[Request]) -> list[Completion]:
        out = []
        for r in requests:
            self.requests.append(r)
            prompt, g = r.key
            text, finish = prompt.meta["outs"][g % len(prompt.meta["outs"])]
            n = len(text)
            out.append(
                Completion(
                    r, [ord(c) for c in text], [-0.5] * n, [self.version] * n, finish, 0.0, 0.0
                )
            )
        return out

    def prompts_generated(self) -> list[str]:
        return [r.key[0].id for r in self.requests if r.key[1] == 0]


def _prompt(pid: str, *outs: tuple[str, FinishReason]) -> Prompt:
    return Prompt(pid, f"{pid}=", "1", {"outs": list(outs)})


MIXED = [("1", STOP), ("0", STOP)]  # half right: informative
EASY = [("1", STOP)]  # always right: zero variance
HARD = [("0", STOP)]  # always wrong: zero variance


def _run(prompts: list[Prompt], *overrides: str) -> Run:
    cfg = load_config(None, ["trainer.batch_prompts=4", "sampling.group_size=4", *overrides])
    return Run(
        cfg=cfg,
        dir=None,
        model=None,
        tok=CharTok(),
        task=Verifier(),
        source=CycleSource(prompts),
        engine=ScriptedEngine(),
        eval_engine=None,
        trainer=None,
        sink=None,
        rollouts=None,
        timeline=None,
        view=None,
        heldout=[],
        pass_rates=PassRateTracker(cfg.filters.pass_rate_low, cfg.filters.pass_rate_high),
        replay=ReplayBuffer(cfg.replay.capacity_per_prompt) if cfg.replay.enabled else None,
        rng=random.Random(0),
    )  # type: ignore[arg-type]


def _assert_accounts(run: Run, generated: list[Group], kept: list[Group]) -> None:
    """Ledger balanced and tokens/generated = trained - replayed + wasted, exactly."""
    assert run.ledger.generated == len(generated) == len(kept) + sum(run.ledger.filtered.values())
    gen = sum(g.num_tokens for g in generated)
    trained = sum(g.num_tokens for g in kept)
    assert gen == trained - run.counters["tokens/replayed"] + run.counters["tokens/wasted"]


# ---- dynamic sampling --------------------------------------------------------------------------


def test_dynamic_sampling_refills_until_the_batch_is_full():
    # Cycle E M E M ...: the first draw of 4 keeps 2; the refill of 2 keeps 1; then 1 keeps 0
    # (an E), then 1 keeps 1 (an M): 4 extra draws, 4 informative groups.
    run = _run([_prompt("e", *EASY), _prompt("m", *MIXED)], "filters.dynamic_sampling=true")
    generated, kept = run.collect(4)
    assert len(kept) == 4 and all(g.prompt.id == "m" for g in kept)
    assert run.counters["filters/extra_draws"] == 4 and len(generated) == 8
    assert run.ledger.filtered == {"zero_variance": 4}
    _assert_accounts(run, generated, kept)


def test_dynamic_sampling_stops_at_the_extra_draw_bound():
    run = _run(
        [_prompt("e", *EASY), _prompt("h", *HARD)],
        "filters.dynamic_sampling=true",
        "filters.max_extra_draws=5",
    )
    generated, kept = run.collect(4)
    assert kept == [] and len(generated) == 4 + 5
    assert run.counters["filters/extra_draws"] == 5 and run.ledger.filtered == {"zero_variance": 9}
    assert run.counters["tokens/wasted"] == sum(g.num_tokens for g in generated)
    _assert_accounts(run, generated, kept)


def test_without_dynamic_sampling_one_draw_per_step():
    run = _run([_prompt("e", *EASY), _prompt("m", *MIXED)])
    generated, kept = run.collect(4)
    assert len(generated) == 4 and len(kept) == 2 and run.counters["filters/extra_draws"] == 0


# ---- pass-rate band ----------------------------------------------------------------------------


def test_pass_rate_band_spends_no_generation_on_mastered_or_hopeless_prompts():
    prompts = [_prompt("e", *EASY), _prompt("m", *MIXED), _prompt("h", *HARD)]
    run = _run(prompts, "filters.pass_rate_band=true", "trainer.batch_prompts=3")
    run.collect(3)  # all unseen: each drawn once; e reaches 1.0, h 0.0
    engine = run.engine
    assert engine.prompts_generated() == ["e", "m", "h"]
    _, kept = run.collect(3)
    assert engine.prompts_generated()[3:] == ["m", "m", "m"]  # no request for e or h
    # the cycle e m h e m h e m: five skips to draw three m
    assert (
        run.prompts_skipped
        == {"pass_rate_band": 5}
        == {"pass_rate_band": run.counters["filters/prompts_skipped"]}
    )
    assert len(kept) == 3 and run.ledger.generated == 6


def test_pass_rate_band_settings_come_from_the_config():
    # Groups of 4 and min_attempts 8: e and h stay "unseen" for two groups, then the band
    # excludes them; retry_after 1 draws an excluded prompt again after one skip.
    prompts = [_prompt("e", *EASY), _prompt("m", *MIXED), _prompt("h", *HARD)]
    run = _run(
        prompts,
        "filters.pass_rate_band=true",
        "trainer.batch_prompts=3",
        "filters.pass_rate_min_attempts=8",
        "filters.pass_rate_retry_after=1",
        "filters.pass_rate_ema_decay=0.5",
    )
    run.pass_rates = make_pass_rate_tracker(run.cfg)
    t = run.pass_rates
    assert (t.min_attempts, t.retry_after, t.ema_decay) == (8, 1, 0.5)
    run.collect(3)
    run.collect(3)
    assert run.engine.prompts_generated() == ["e", "m", "h"] * 2  # 4 < 8 attempts: all drawn
    run.collect(3)  # cycle e m h e m: e skipped, m, h skipped, e retried, m
    assert run.engine.prompts_generated()[6:] == ["m", "e", "m"]
    assert run.prompts_skipped == {"pass_rate_band": 2}


def test_pass_rate_band_without_refill_keeps_the_dataset_order():
    # refill off: each step takes the next 3 prompts of the cycle and generates only those the
    # band lets through, as if e and h had been generated and dropped by zero_variance.
    prompts = [_prompt("e", *EASY), _prompt("m", *MIXED), _prompt("h", *HARD)]
    run = _run(
        prompts, "filters.pass_rate_band=true", "trainer.batch_prompts=3",
        "filters.pass_rate_refill=false",
    )  # fmt: skip
    run.collect(3)
    _, kept = run.collect(3)
    assert run.engine.prompts_generated() == ["e", "m", "h", "m"]
    assert run.source.index == 6 and len(kept) == 1
    assert run.prompts_skipped == {"pass_rate_band": 2}


def test_pass_rate_band_without_refill_generates_at_least_one_group():
    # e and h both excluded: the step draws on until one prompt passes (here the bound of
    # 50 x 2 tries is reached first and the last drawn prompt is taken).
    run = _run(
        [_prompt("e", *EASY), _prompt("h", *HARD)], "filters.pass_rate_band=true",
        "trainer.batch_prompts=2", "filters.pass_rate_refill=false",
    )  # fmt: skip
    run.collect(2)
    groups, _ = run.collect(2)
    assert len(groups) == 1 and run.prompts_skipped == {"pass_rate_band": 100}


def test_pass_rate_band_defaults():
    f = load_config().filters
    assert not f.pass_rate_band  # off unless asked for
    t = make_pass_rate_tracker(load_config())
    assert (t.min_attempts, t.retry_after, t.ema_decay, t.skip_prob) == (16, 0, None, 1.0)
    assert f.pass_rate_refill
    t = make_pass_rate_tracker(load_config(None, ["filters.pass_rate_skip_prob=0.5", "run.seed=7"]))
    assert (t.skip_prob, t.seed) == (0.5, 7)


# ---- adaptive group size -----------------------------------------------------------------------


def test_adaptive_group_size_keeps_the_budget_and_favours_hard_prompts():
    # Smoothed pass rates (passes + 1) / (attempts + 2): e 9/10, m 5/10, h 1/10. The allocation
    # maximises the expected number of informative groups, which is symmetric in p <-> 1 - p:
    # h and e get the same G (with the pass-rate band on, e is not drawn at all).
    e, m, h = (
        _prompt("e", *EASY),
        _prompt("m", *MIXED),
        _prompt("h", *([("0", STOP)] * 15 + [("1", STOP)])),
    )
    run = _run([e, m, h, m], "sampling.adaptive_group_size=true", "sampling.group_size=8")
    for p, rewards in ((e, [1.0] * 8), (m, [1.0, 0.0] * 4), (h, [0.0] * 8)):
        run.pass_rates.update(p.id, rewards)
    sizes = run.group_sizes([e, m, h, m])
    assert sizes == [11, 5, 11, 5] and sum(sizes) == 4 * 8
    n0 = len(run.engine.requests)
    generated, _ = run.collect(4)
    assert len(run.engine.requests) - n0 == 32  # the same generation budget as G = 8 each
    assert [len(g.samples) for g in generated] == sizes  # completions split by the sizes
    assert all(s.prompt_id == g.prompt.id for g in generated for s in g.samples)
    assert [s.seed for s in generated[2].samples] == [
        generated[2].samples[0].seed + i for i in range(11)
    ]


def test_adaptive_group_size_off_gives_every_prompt_g():
    run = _run([_prompt("m", *MIXED)], "sampling.group_size=6")
    run.pass_rates.update("m", [0.0] * 8)
    assert run.group_sizes([run.source.draw()] * 3) == [6, 6, 6]


# ---- replay ------------------------------------------------------------------------------------


def test_replay_mixes_a_stored_success_into_an_all_fail_group():
    p = _prompt("p", ("1xx", STOP), ("0", STOP), ("0", STOP), ("0", STOP))
    run = _run([p], "replay.enabled=true", "replay.per_group=1")
    first, kept1 = run.collect(1)  # one success: stored, group trained as is
    assert run.replay is not None and len(run.replay) == 1 and kept1 == first
    run.engine.version = 7
    p.meta["outs"] = [("0", STOP)]  # from now on every sample fails
    second, kept2 = run.collect(1)
    assert (
        len(kept2) == 1 and kept2[0] is not second[0]
    )  # a new group; the generated one is unchanged
    replayed = [s for s in kept2[0].samples if s.reward == 1.0]
    assert len(replayed) == 1 and replayed[0].versions_T == [0, 0, 0]  # keeps its version and logp
    assert replayed[0].behavior_logp_T == [-0.5] * 3
    assert all(s.versions_T == [7] for s in kept2[0].samples if s.reward == 0.0)
    assert kept2[0].advantages_G is not None and max(kept2[0].advantages_G) > 0
    assert run.counters["replay/samples"] == 1 and run.counters["tokens/replayed"] == 3
    assert run.counters["tokens/wasted"] == 1  # the generated sample it replaced
    _assert_accounts(run, first + second, kept1 + kept2)


def test_without_replay_the_all_fail_group_is_dropped():
    p = _prompt("p", ("1", STOP), ("0", STOP))
    run = _run([p])
    run.collect(1)
    p.meta["outs"] = HARD
    assert run.collect(1)[1] == [] and run.ledger.filtered == {"zero_variance": 1}


# ---- overlong ----------------------------------------------------------------------------------


def test_overlong_penalty_shapes_the_rewards_that_advantages_see():
    # max_new_tokens 10, cache 4: no penalty up to 6 tokens, then (6 - L) / 4 down to -1 at 10.
    p = _prompt("p", ("1", STOP), ("1xxxxxx", STOP), ("1xxxxxxxxx", LENGTH), ("1x", STOP))
    args = ["sampling.max_new_tokens=10", "filters.overlong_cache=4", 'trainer.advantage="dr_grpo"']
    assert _run([p], *args).collect(1)[1] == []  # all right: zero variance, dropped
    run = _run([p], *args, 'filters.overlong="penalty"')
    generated, kept = run.collect(1)
    shaped = [1.0, 0.75, 0.0, 1.0]  # lengths 1, 7, 10, 2
    mean = sum(shaped) / 4
    assert kept[0].advantages_G == pytest.approx([r - mean for r in shaped])
    assert [s.reward for s in kept[0].samples] == [1.0] * 4  # the verifier's reward is kept
    assert run.pass_rates.pass_rate("p") == 1.0
    _assert_accounts(run, generated, kept)


def test_overlong_mask_takes_truncated_samples_out_and_counts_their_tokens():
    p = _prompt("p", ("1", STOP), ("0xxxxxxxxx", LENGTH), ("0", STOP), ("1xxxxxxxxx", LENGTH))
    q = _prompt(
        "q", ("1xxxxxxxxx", LENGTH), ("0xxxxxxxxx", LENGTH), ("0xxxxxxxxx", LENGTH), ("0", STOP)
    )
    run = _run([p, q], "sampling.max_new_tokens=10", 'filters.overlong="mask"')
    generated, kept = run.collect(2)
    assert len(kept) == 1 and [s.completion_text for s in kept[0].samples] == ["1", "0"]
    assert kept[0].advantages_G == pytest.approx([0.7071063, -0.7071063])
    assert len(generated[0].samples) == 4  # the generated group is untouched
    assert run.ledger.filtered == {"overlong": 1}  # q keeps one sample: no group to compare
    assert run.counters["filters/overlong_masked"] == 2 + 3
    assert run.counters["tokens/wasted"] == 20 + 31
    _assert_accounts(run, generated, kept)


def test_overlong_mask_loss_keeps_truncated_rewards_in_the_group_as_trl_does():
    """TRL's mask_truncated_completions: a truncated sample's reward is in its group's mean
    and std, and only its loss mask is zero. Golden, grpo: p's rewards [1, 0, 0, 1] (the
    third cut), mean 1/2, sample std sqrt(1/3): the others get +-(1/2) sqrt(3) = +-0.8660,
    not `mask`'s [0.5774, -1.1547, 0.5774] of [1, 0, 1]. q: rewards [1, 0, 0, 0], three cut,
    mean 1/4, std 1/2: its one finished sample gets -1/2 (`mask` drops q). r: all cut."""
    p = _prompt("p", ("1", STOP), ("0", STOP), ("0xxxxxxxxx", LENGTH), ("1", STOP))
    q = _prompt(
        "q", ("1xxxxxxxxx", LENGTH), ("0xxxxxxxxx", LENGTH), ("0xxxxxxxxx", LENGTH), ("0", STOP)
    )
    r = _prompt("r", ("0xxxxxxxxx", LENGTH), ("1xxxxxxxxx", LENGTH))
    run = _run([p, q, r], "sampling.max_new_tokens=10", 'filters.overlong="mask_loss"')
    generated, kept = run.collect(3)
    assert [[s.completion_text for s in g.samples] for g in kept] == [["1", "0", "1"], ["0"]]
    half_sqrt3 = 0.5 / (3**-0.5 + 1e-6)  # grpo's eps 1e-6
    assert kept[0].advantages_G == pytest.approx([half_sqrt3, -half_sqrt3, half_sqrt3])
    assert kept[1].advantages_G == pytest.approx([-0.25 / (0.5 + 1e-6)])
    assert [len(g.samples) for g in generated] == [4, 4, 4]  # the generated groups untouched
    assert run.ledger.filtered == {"overlong": 1}  # r: nothing left to train
    assert run.counters["filters/overlong_masked"] == 1 + 3 + 4  # as `mask` counts them
    assert run.counters["tokens/wasted"] == 10 + 30 + 40  # every cut token, none trained
    _assert_accounts(run, generated, kept)
    # the cut samples still count as sequences of the step's normaliser, as in TRL (the trainer
    # adds them: tests/test_trainer.py::test_mask_loss_keeps_a_truncated_sequence_in_the_...)
    assert [g.masked for g in kept] == [1, 3]
    # the cut sample's loss mask is all zero: a zero row is the row left out of the loss, in
    # every agg (`aggregate` counts the sequences with a loss token)
    full = collate(generated[0].samples, [half_sqrt3, -half_sqrt3, 0.0, half_sqrt3], [0] * 4, 0)
    full.loss_mask[2] = False
    ours = collate(kept[0].samples, kept[0].advantages_G, [0] * 3, 0)
    for agg in losses.AGGS:
        got = [
            losses.aggregate(
                b.advantages[:, None] * b.loss_mask.cumsum(1), b.loss_mask, agg, max_len=10
            )
            for b in (full, ours)
        ]
        assert got[0] == pytest.approx(float(got[1])), agg


# ---- end to end --------------------------------------------------------------------------------


def _tiny_cfg(tmp_path, name, *extra):
    return load_config(
        None,
        [
            f'run.dir="{tmp_path / name}"',
            "run.steps=3",
            "run.quiet=true",
            "run.threads=1",
            "trainer.batch_prompts=4",
            "sampling.group_size=4",
            "eval.every=3",
            "eval.num_prompts=16",
            "warmstart.max_steps=30",
            "warmstart.target_acc=0.99",
            f'warmstart.cache_dir="{warm_cache(tmp_path)}"',
            "checkpoint.every=3",
            *extra,
        ],
    )


@pytest.mark.slow
@pytest.mark.parametrize("overlong", ["mask", "mask_loss"])
def test_every_algorithm_knob_on_in_a_real_run_keeps_exact_accounts(
    tmp_path, monkeypatch, overlong
):
    # The barely warm-started model solves nothing; a parity reward gives groups variance, which
    # is all that accounting needs.
    monkeypatch.setattr(RunningSums, "reward", lambda self, prompt, text: float(len(text) % 2 == 0))
    cfg = _tiny_cfg(
        tmp_path,
        "all",
        "task.max_train_prompts=8",
        "filters.pass_rate_band=true",
        "filters.dynamic_sampling=true",
        "filters.max_extra_draws=8",
        f"filters.overlong={overlong}",
        "sampling.max_new_tokens=12",
        "sampling.adaptive_group_size=true",
        "sampling.group_size_max=8",
        "replay.enabled=true",
        "run.steps=5",
    )
    summary = train_sync(cfg)
    records = [json.loads(x) for x in (tmp_path / "all" / "metrics.jsonl").read_text().splitlines()]
    assert summary["steps"] == 5 and summary["ledger"]["balanced"]
    for r in records:
        assert (
            r["tokens/generated"] == r["tokens/trained"] - r["tokens/replayed"] + r["tokens/wasted"]
        )
        assert r["filters/extra_draws"] <= 8
    ledger = summary["ledger"]
    assert ledger["generated"] == ledger["trained"] + sum(ledger["filtered"].values())
    assert set(ledger["filtered"]) <= {"zero_variance", "overlong"}
    for key in ("filters/overlong_masked", "filters/extra_draws", "filters/prompts_skipped"):
        assert sum(r[key] for r in records) > 0, key  # each knob acted in this run
    assert sum(r["filters/prompts_skipped"] for r in records) == sum(
        summary["prompts_skipped"].values()
    )


@pytest.mark.slow
def test_tokens_the_loss_drops_as_non_finite_are_wasted_not_trained(tmp_path, monkeypatch):
    """A token whose log-prob is not finite leaves the loss: `tokens/trained` is the loss mask
    less those tokens, and `tokens/wasted` counts them, so the accounts still add up.
    (`tokens/trained` was the whole loss mask.)"""
    from slipstream.train.trainer import Trainer

    monkeypatch.setattr(RunningSums, "reward", lambda self, prompt, text: float(len(text) % 2 == 0))
    forward, step = Trainer.logprobs, Trainer.step
    masked: list[int] = []  # each step's loss-mask tokens

    def first_token_nan(self, batch):  # of each micro-batch's first row: a nan forward
        logp, entropy = forward(self, batch)
        first = batch.loss_mask[0].nonzero()[0, 0]
        return logp.index_put((torch.tensor(0), first), torch.tensor(math.nan)), entropy

    def counting_step(self, groups):
        masked.append(int(self.batch(groups).loss_mask.sum()))
        return step(self, groups)

    monkeypatch.setattr(Trainer, "logprobs", first_token_nan)
    monkeypatch.setattr(Trainer, "step", counting_step)
    train_sync(_tiny_cfg(tmp_path, "nan"))
    records = [json.loads(x) for x in (tmp_path / "nan" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == len(masked) == 3
    for r, n in zip(records, masked):
        assert r["train/nonfinite_tokens"] >= 1
        assert r["tokens/trained"] == n - r["train/nonfinite_tokens"]
        assert r["tokens/generated"] == r["tokens/trained"] + r["tokens/wasted"]  # no replay


@pytest.mark.slow
def test_a_step_skipped_as_non_finite_trains_no_token_and_wastes_them_all(tmp_path, monkeypatch):
    """A non-finite gradient at step 2 (injected on one parameter) skips the step: it trained
    no token (`tokens/trained` 0, where it counted the whole loss mask) and every one of them
    is wasted, so tokens/generated = trained + wasted still holds on each step; its
    `tokens/computed` is the loss mask, as a taken step's; the ledger settles its groups as
    filtered `skipped_step`."""
    from slipstream.train.trainer import Trainer

    monkeypatch.setattr(RunningSums, "reward", lambda self, prompt, text: float(len(text) % 2 == 0))
    step = Trainer.step
    masked: list[int] = []  # each step's loss-mask tokens
    sizes: list[int] = []  # each step's groups

    def nan_grad_at_step_2(self, groups):
        masked.append(int(self.batch(groups).loss_mask.sum()))
        sizes.append(len(groups))
        if self.version != 1:
            return step(self, groups)
        hook = next(self.model.parameters()).register_hook(lambda g: g * math.nan)
        try:
            return step(self, groups)
        finally:
            hook.remove()

    monkeypatch.setattr(Trainer, "step", nan_grad_at_step_2)
    summary = train_sync(_tiny_cfg(tmp_path, "skip"))
    records = [
        json.loads(x) for x in (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()
    ]
    assert summary["skipped_steps"] == 1 and len(records) == len(masked) == 3
    assert [r["train/skipped"] for r in records] == [0.0, 1.0, 0.0]
    for r, n in zip(records, masked):
        assert r["tokens/trained"] == (0 if r["train/skipped"] else n)
        assert r["tokens/generated"] == r["tokens/trained"] + r["tokens/wasted"]  # no replay
    assert [r["tokens/computed"] for r in records] == masked
    # the skipped step's groups entered no update: the ledger settles them as filtered
    # `skipped_step`, not trained (it counted them as trained before)
    ledger = summary["ledger"]
    assert ledger["filtered"]["skipped_step"] == sizes[1]
    assert ledger["trained"] == sizes[0] + sizes[2] and ledger["balanced"]
