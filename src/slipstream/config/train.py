"""Config sections of the optimizer step: trainer, filters, replay."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from slipstream.algo import advantages, losses
from slipstream.config.base import _check_name, _Section, check_device_name

CLIP_SETTINGS = ("eps_low", "eps_high", "dual_clip")
"""The trainer's settings that are PPO-family loss settings of the same name (algo.losses)."""


class TrainerConfig(_Section):
    batch_prompts: int = Field(64, ge=1)
    """B: prompts per optimizer step (B x G samples)."""
    lr: float = Field(6e-4, gt=0.0, lt=1.0)
    """AdamW learning rate: 6e-4 for the built-in model (trained from scratch); with a
    `model.path` the default is TRL's 1e-6 (config.load.PRETRAINED_DEFAULTS)."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW `(beta1, beta2)`, each in [0, 1). The default's beta2 of 0.99 (torch's and TRL's is
    0.999) averages the second moment over about 100 steps instead of 1000, so it follows the
    gradient scale of RL, which moves as rewards and advantages shift, sooner; the built-in
    task's runs were tuned with it. `[0.9, 0.999]` matches TRL (bench/peer_trl.py)."""
    warmup_steps: int = Field(10, ge=0)
    """Linear learning-rate warm-up steps."""
    lr_schedule: Literal["constant", "cosine"] = "cosine"
    """After warm-up: constant, or cosine decay to `lr * lr_min_ratio` at `run.steps`. The decay
    keeps late steps from undoing early gains on small models (noisy RL gradients)."""
    lr_min_ratio: float = Field(0.1, ge=0.0, le=1.0)
    """Final learning rate as a fraction of `lr` (cosine schedule)."""
    grad_clip: float = Field(1.0, gt=0.0)
    """Clip the global gradient norm to this value."""
    micro_batch_size: int = Field(16, ge=1)
    """Samples per forward/backward; the loss normaliser is the whole step's token count, so
    this never changes the gradient."""
    micro_batch_tokens: int = Field(0, ge=0)
    """Token budget of a micro-batch: rows x padded width at most this, or with `packing` the
    sum of its rows' widths (a longer row goes alone); with `micro_batch_size` still the row
    bound. 0: rows only. Like the row bound it never changes the gradient (train.microbatch);
    it bounds the activation memory."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping
    them: activation memory falls from all layers' to about one layer's plus the layer
    inputs, for about a third more compute."""
    packing: bool = False
    """Padding-free micro-batches: the rows of a micro-batch are packed end to end into one
    row, each attending only within itself, so no compute goes to padding. Its attention mask
    is `[tokens, tokens]`, so keep `micro_batch_tokens` to a few thousand with it."""
    device: str = "cpu"
    """Where the trainer's model and optimizer live: `cpu`, `cuda` or `cuda:N`. A CUDA device
    on a machine without one is a configuration error."""
    advantage: str = "grpo"
    """Advantage estimator: one of slipstream.algo.advantages.METHODS."""
    loss: str = "ppo"
    """Policy loss: one of slipstream.algo.losses.METHODS."""
    agg: str | None = None
    """Loss aggregation (token-mean, seq-mean-token-mean, seq-mean-token-sum, token-sum-norm).
    None: the loss's own default (token-mean for ppo, dapo, reinforce, cispo, dro; seq-mean-
    token-mean for gspo, oapl), except on the built-in task, whose config picks
    seq-mean-token-mean (there token-mean lets long failed traces dominate and was less
    stable). The resolved value is what config.toml records."""
    proximal: Literal["auto", "none", "recompute", "loglinear"] = "auto"
    """The proximal policy of the decoupled objective (docs/algorithms.md). `none`: ratios
    against the sampler's log-probs, no behaviour weight. `recompute`: the weights at the start
    of the step (AReaL's decoupled PPO; free here, since a step is one optimizer update, and for
    the same reason without a binding trust region: it collapsed on stale data in
    bench/staleness.py). `loglinear`: AReaL's interpolation between the sampler's and the
    current log-probs by version. `auto`: `none` for fresh data from an exact sampler,
    `recompute` for fresh data from an inexact (bfloat16) sampler or with truncated behaviour
    log-probs (`behavior_logprobs`), `loglinear` when data can be stale (max lag above 0, or
    replay)."""
    behavior_logprobs: Literal["full", "truncated"] = "full"
    """The behaviour log-prob `log mu` the ratios and the behaviour weight divide by, when
    `sampling.top_k` or `top_p` truncates the sampler (without them both are the same). `full`:
    the recorded `log p` of the full temperature-scaled softmax, so `pi / mu` reads 1 on-policy
    but is biased by `1 / Z` (Z: the kept mass). `truncated`: `log p - log Z`, the exact
    log-prob of the truncated distribution the token was drawn from, so the weight is
    unbiased. It needs `proximal = "recompute"`, where `pi_prox / mu` is only a detached
    weight: as the trust-region ratio (`none`, and `loglinear` for fresh tokens) it reads Z < 1
    on-policy, which the clip then cuts (engine.sampling). `auto` picks `recompute` for it on
    fresh data; `none`, `loglinear`, or `auto` on data that can be stale, is a config error."""
    eps_low: float | None = Field(None, ge=0.0)
    """PPO-family lower clip; None uses the loss's default."""
    eps_high: float | None = Field(None, ge=0.0)
    """PPO-family upper clip (clip-higher, DAPO); None uses the loss's default."""
    dual_clip: float | None = Field(None, gt=1.0)
    """PPO-family dual clip c (Ye et al. 2020; verl's `clip_ratio_c`, 3.0 there): a
    negative-advantage token's loss is at most `-adv x c`, however far its ratio is above 1.
    None: off."""
    vcpo: bool = False
    """Scale each step's learning rate by the ESS of its sequence weights (VCPO)."""

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError(f"each beta must be in [0, 1), got {list(v)}")
        return v

    @field_validator("device")
    @classmethod
    def _device_syntax(cls, v: str) -> str:
        return check_device_name(v)

    @model_validator(mode="after")
    def _known_methods(self) -> TrainerConfig:
        _check_name("trainer.advantage", self.advantage, advantages.METHODS)
        _check_name("trainer.loss", self.loss, losses.METHODS)
        takes = losses.METHODS[self.loss].defaults
        clips = [k for k in CLIP_SETTINGS if getattr(self, k) is not None]
        if any(k not in takes for k in clips):  # else the first step raises, after setup
            raise ValueError(
                f"trainer.{' and trainer.'.join(clips)}: loss {self.loss!r} takes no PPO clip "
                "(its own constants are fixed); ppo, dapo and gspo take one"
            )
        if self.agg is not None:
            _check_name("trainer.agg", self.agg, losses.AGGS)
        return self


class CorrectionConfig(_Section):
    """The rollout correction: how the behaviour weight `w = pi_prox / mu` applies (TIS, MIS,
    IcePop and geometric masks are settings of it; docs/algorithms.md)."""

    level: Literal["token", "sequence", "geometric"] = "token"
    """`token`: one weight per token. `sequence`: the product of a sequence's token weights.
    `geometric`: their geometric mean (length-normalised, as GSPO's ratio)."""
    action: Literal["truncate", "mask"] = "truncate"
    """`truncate`: `min(w, high)` (truncated importance sampling). `mask`: tokens (or
    sequences, at the sequence levels) with `w` outside `[low, high]` leave the loss and its
    denominators; the rest keep their weight (MIS, IcePop)."""
    low: float | None = Field(None, ge=0.0, le=1.0)
    """Lower bound of `mask`; None: `1 / high`."""
    high: float = Field(2.0, ge=1.0)
    """Truncation cap, and upper bound of `mask`."""


class FilterConfig(_Section):
    zero_variance: bool = True
    """Drop groups whose rewards are all equal: they carry no gradient."""
    pass_rate_band: bool = False
    """Stop drawing prompts whose running pass rate is <= low or >= high (saves generation)."""
    pass_rate_low: float = Field(0.05, ge=0.0, le=1.0)
    """Lower bound of the pass-rate band: prompts at or below it (hopeless) are not drawn."""
    pass_rate_high: float = Field(0.9, ge=0.0, le=1.0)
    """Upper bound of the pass-rate band: prompts at or above it (mastered) are not drawn."""
    pass_rate_min_attempts: int = Field(16, ge=1)
    """Scored samples a prompt needs before the band may exclude it (below, it is always drawn).
    The default is two groups of the default `sampling.group_size` = 8: one group of 8 failures
    happens by chance to 43 % of prompts with a true pass rate of 0.1 (0.9^8), two to 19 %, so
    one group is too little evidence to drop a prompt for good. This is the practice of
    difficulty filtering in DAPO-style training (Skywork-OR1, Polaris): a prompt is judged
    hopeless or mastered from several rollouts' pass rate (16 or more), not from one group;
    DAPO's own dynamic sampling (§3.2) only drops a group, never the prompt."""
    pass_rate_ema_decay: float | None = Field(None, ge=0.0, lt=1.0)
    """None: the band judges the all-time pass rate (passes / attempts). A decay `a`: an
    exponential moving average over groups, `p <- a p + (1 - a) q`, so a prompt that the
    policy has learned leaves the band sooner (a prompt already excluded gets no new groups
    unless `pass_rate_retry_after` re-admits it)."""
    pass_rate_retry_after: int = Field(0, ge=0)
    """Re-admit an excluded prompt: after the band skipped it this many times since its last
    group, it is drawn once more (reason `retry`), so a prompt excluded by chance or since
    learned can come back (as GRESO re-samples skipped prompts with some probability). With
    prompts drawn once per epoch, N means one group every N + 1 epochs. 0: never (excluded
    for the rest of the run)."""
    pass_rate_skip_prob: float = Field(1.0, ge=0.0, le=1.0)
    """s: how surely the band skips a prompt outside it. 1 (default): always, the hard band. Below
    1, the selective-rollout rule of GRESO (Zheng et al. 2025): a prompt outside the band whose
    last z groups each had a pass rate outside it (with G = 8: all failed or all passed, the
    zero-variance groups GRESO counts) is skipped with probability
    `1 - (1 - s)^z` and drawn otherwise, so the longer its uninformative streak, the rarer its
    groups, yet it is never excluded for good: once the policy can solve some of a hopeless
    prompt (or fail a mastered one) its next group ends the streak and it is drawn again. With
    s = 0.5: drawn 1/2 of the time after one such group, 1/8 after three."""
    pass_rate_refill: bool = True
    """What takes a skipped prompt's place in the step. True: the next prompt of the dataset,
    so every step still generates B groups (more of them informative) and epochs end sooner.
    False: nothing, as if its group had been generated and dropped by `zero_variance`: each
    step takes the same B prompts of the dataset as without the band and generates only the
    ones the band lets through (at least one), so the band saves exactly the generation of the
    groups it predicts to be uninformative. Only the in-process sync loop (`sync` schedule,
    `runtime.kind = "inprocess"`) honours False, and False anywhere else is a config error: the
    other schedules and runtimes issue prompts until a step holds B groups, which refills."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling (§3.2): after filtering, draw more prompts until the step holds B
    informative groups or `max_extra_draws` extra prompts were drawn. Each refill draws only
    the missing number of prompts, so a step never holds more than B groups. Needs
    `zero_variance` (it refills what the filters drop)."""
    max_extra_draws: int = Field(32, ge=0)
    """Bound of dynamic sampling: prompts drawn in one step beyond the first B."""
    overlong: Literal["off", "mask", "mask_loss", "penalty"] = "off"
    """Truncated completions (DAPO §3.4). `mask`: a completion cut at max_new_tokens is taken
    out of its group before advantages, so the others' advantages are computed without its
    reward (a group left with fewer than 2 samples is dropped, reason `overlong`).
    `mask_loss` (TRL's `mask_truncated_completions`): its reward stays in the group's mean and
    std, and only its loss mask is zero, yet it counts as a sequence of the per-sequence
    normalisers as in TRL (docs/algorithms.md, "Aggregation"; a group whose samples are all cut
    is dropped, reason `overlong`). Both count it in `filters/overlong_masked` and its tokens
    as tokens/wasted. `penalty`: add the soft length
    penalty, 0 up to max_new_tokens - overlong_cache, then linear down to -1, to the reward
    used for advantages (the verifier's reward is still what is logged and tracked); for one
    completion, not a multi-turn episode (an error with an environment)."""
    overlong_cache: int = Field(16, ge=0)
    """L_cache of the overlong penalty, in tokens (at most sampling.max_new_tokens)."""


class ReplayConfig(_Section):
    enabled: bool = False
    """Keep past successes of each prompt and replace up to `per_group` samples of a group that
    has no success with stored ones (RePO / RLEP). A replayed sample keeps its behaviour
    log-probs and versions, so the loss's importance ratio corrects for its age."""
    capacity_per_prompt: int = Field(4, ge=1)
    """Successes stored per prompt; the newest are kept."""
    per_group: int = Field(1, ge=1)
    """k: stored successes mixed into one group with no success (at most its size)."""
