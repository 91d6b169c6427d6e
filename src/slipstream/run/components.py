"""The components `setup` assembles from a `Config`: the pass-rate tracker, device placement,
the prompts' token lengths, the engine's shape within its KV budget, and the trainer with its
proximal policy resolved."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

from slipstream.algo.correction import CorrectionSpec
from slipstream.config import Config, ConfigError
from slipstream.config.load import truncated_behavior
from slipstream.engine import capacity
from slipstream.model import CausalLM, Tokenizer
from slipstream.model.llama import window_error
from slipstream.runtime import placement
from slipstream.schedule.pass_rate import PassRateTracker
from slipstream.schedule.presets import preset
from slipstream.train.precision import parse_dtype
from slipstream.train.trainer import Trainer, resolve_proximal
from slipstream.types import Prompt


def make_pass_rate_tracker(cfg: Config) -> PassRateTracker:
    """The pass-rate tracker with the band settings of `cfg.filters`."""
    f = cfg.filters
    return PassRateTracker(
        f.pass_rate_low,
        f.pass_rate_high,
        ema_decay=f.pass_rate_ema_decay,
        min_attempts=f.pass_rate_min_attempts,
        retry_after=f.pass_rate_retry_after,
        skip_prob=f.pass_rate_skip_prob,
        seed=cfg.run.seed,
    )


def resolve_placement(cfg: Config) -> placement.Placement:
    """Devices of the trainer and the samplers; ConfigError (exit 2) if the machine lacks one."""
    rc, kind = cfg.runtime, cfg.runtime_kind
    n = rc.num_samplers if kind != "inprocess" else 1
    where = placement.resolve(
        cfg.trainer.device, rc.sampler_devices, n, placement.cuda_device_count()
    )
    if kind == "ray":  # Ray places sampler actors (`sampler_resources`) and sets their GPU
        gpu = rc.sampler_resources.get("GPU", 0) > 0
        where = placement.Placement(where.trainer, ("cuda:0" if gpu else "cpu",) * n)
    return where


def engine_share(cfg: Config, where: placement.Placement, sampler: int | None = None) -> float:
    """The share of its GPU's free memory the engine of sampler `sampler` (None: the trainer's
    evaluation engine) sizes itself within (`placement.memory_share`): on the local runtime,
    the engines on its GPU split it (they measure the same free memory); on Ray, an actor
    that asked for a fraction of a GPU (`GPU` of runtime.sampler_resources, or of
    runtime.trainer_resources for the trainer actor; a trainer in the driver asked Ray for
    none) takes that fraction of it."""
    rc = cfg.runtime
    if sampler is None:
        device, asked = where.trainer, rc.trainer_resources if rc.trainer_actor else {}
    else:
        device, asked = where.samplers[sampler], rc.sampler_resources
    gpu = asked.get("GPU", 0.0)
    return placement.memory_share(cfg.runtime_kind, where.engines_on(device), gpu)


LONG_MEASURE = 5_000_000  # characters of prompts from which measuring them is said (seconds)


def prompt_lengths(
    tok: Tokenizer,
    named: dict[str, list[Prompt]],
    log: Callable[[str], None],
    many: int = LONG_MEASURE,
) -> dict[str, list[int]]:
    """The token length of every prompt of each named set (`Tokenizer.prompt_lengths`, in
    batches: a dataset of 100k+ rows takes seconds, not minutes). From `many` characters of
    prompts on (a few seconds here) it is said before and after in `log` (the live view's), so
    a long measurement is not a silent terminal; a small task's is not worth two lines (the
    built-in task's 20k prompts take 0.2 s)."""
    n, t = sum(map(len, named.values())), time.perf_counter()
    long = sum(len(p.text) for ps in named.values() for p in ps) >= many
    if long:
        log(f"measuring the token length of {n} prompts...")
    lengths = {k: tok.prompt_lengths(ps) for k, ps in named.items()}
    if long:
        log(f"measured {n} prompts in {time.perf_counter() - t:.1f} s")
    return lengths


def engine_shape(
    cfg: Config,
    where: placement.Placement,
    model: CausalLM,
    lengths: list[int],
    slots: int,
    context: int = 0,
) -> tuple[int, int]:
    """`(slots, max_len)` of an engine for `model` on its device: `max_len` from the prompt
    lengths (`engine.max_len` caps it), or `context` when set (an episode run's,
    `run.agentic.env_max_len`; at most the model's positions), slots at most `slots` within
    the KV budget at that `max_len` (engine.capacity), shared with the engines `where` (the
    run's placement, `resolve_placement`) puts on the trainer's device. ConfigError when no
    prompt fits or the budget holds no sequence."""
    e, new = cfg.engine, cfg.sampling.max_new_tokens
    max_len = capacity.engine_max_len(max(lengths), new, model.config, e.max_len)
    said = f"engine.max_len = {e.max_len}" if e.max_len else "longest prompt + max_new_tokens"
    advice: str | None = None  # None: engine.max_len
    if not any(capacity.fits(n, new, max_len) for n in lengths):
        raise ConfigError(
            f"engine.max_len: {max_len} tokens hold no prompt with sampling.max_new_tokens = {new} "
            f"(shortest prompt: {min(lengths)} tokens)"
        )
    if context:
        max_len = min(context, model.config.max_position_embeddings)
        said = "an episode's context: longest first observation + env.max_tokens"
        advice = "lower env.max_tokens"  # engine.max_len does not bound an episode
    # checked at the length the engine is built with: an episode's context replaces the
    # prompts' length above, and can pass a sliding window they stay within
    too_long = window_error(model.config, max_len, said, advice)
    if too_long:
        raise ConfigError(f"model.path {too_long}")
    # the engine's cache and packed copies take the dtype of `model`'s own parameters (the
    # in-process engine shares the trainer's float32 master weights whatever `model.dtype`)
    p = model.lm_head.weight
    free = capacity.free_device_bytes(p.device)
    share = engine_share(cfg, where)
    graphs = p.device.type == "cuda"  # its decode step is captured (Engine.decode_graph)
    try:
        n = capacity.engine_slots(
            model.config, p.dtype, slots, max_len, e.max_tokens, e.memory_fraction, free,
            graphs=graphs, share=share,
        )  # fmt: skip
        return n, max_len
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_too_long(groups: dict[str, list[int]], new: int, max_len: int) -> None:
    """Prompt lengths by what the prompts are (training, held-out, an `eval.sets` set): those
    that cannot fit `max_len` tokens with `new` more (`capacity.fits`) are skipped, as
    `Run.draw` and `Run.evaluate` skip them. ConfigError when none of a group's prompts fits;
    a warning, once, when some held-out ones do not (training counts them as drawn)."""
    for name, lengths in groups.items():
        skipped = sum(not capacity.fits(n, new, max_len) for n in lengths)
        if lengths and skipped == len(lengths):
            raise ConfigError(
                f"engine.max_len: {max_len} tokens hold no {name} prompt with "
                f"sampling.max_new_tokens = {new} (shortest: {min(lengths)} tokens)"
            )
        if skipped and name != "training":
            where = name.removeprefix("eval.sets.") + "/" if name.startswith("eval.") else ""
            warnings.warn(
                f"{skipped} of {len(lengths)} {name} prompts do not fit engine.max_len = "
                f"{max_len} tokens with sampling.max_new_tokens = {new}: each evaluation skips "
                f"them (heldout/{where}skipped_too_long) and scores the others",
                RuntimeWarning,
                stacklevel=2,
            )


def build_trainer(cfg: Config, model: CausalLM, pad_id: int) -> Trainer:
    """The trainer, with the proximal policy `auto` resolved against the schedule's max lag and
    whether the samplers compute the trainer's log-probs exactly: a bfloat16 sampler does not
    (tests/test_engine_bf16.py), the in-process engine shares the float32 master weights."""
    max_lag = preset(cfg.schedule.name, cfg.schedule.lag_bound).max_lag
    exact = cfg.model.dtype == "float32" or cfg.runtime_kind == "inprocess"
    c = cfg.correction
    return Trainer(
        model,
        cfg.trainer,
        cfg.sampling.temperature,
        pad_id,
        cfg.run.steps,
        parse_dtype(cfg.model.dtype),
        proximal=resolve_proximal(
            cfg.trainer.proximal, max_lag, exact, cfg.replay.enabled, truncated_behavior(cfg)
        ),
        correction_spec=CorrectionSpec(c.level, c.action, c.low, c.high),
        max_new_tokens=cfg.sampling.max_new_tokens,
    )
