"""The synchronous loop: draw, generate, score, advantages, train, repeat. One screen.

Consumes prompts; produces one optimizer step per iteration; waits for the whole batch of
generations (the straggler wait that the other schedules remove). The engine shares the
trainer's model object, so a new version reaches it with no copy. What happens between
generation and the trainer (filters, overlong, replay, dynamic sampling, group sizes) is in
the run's `collect` and `settle`.

This module owns the loop proper and the step record, on a run already built (and, when
resuming, restored): `train_steps`. Building the run, resuming it, writing checkpoints and
finishing it are `slipstream.run` (`run.sync.train_sync` is the public entry). `marks`,
`step_record`, `observe_step`, `ends_on_restored_weights` and `checkpoint_due` are shared
with the orchestrated loops' learner (`run.learner`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from slipstream.engine.stats import PASS_SUMS
from slipstream.observe.clock import EVAL_S, EVAL_START_S
from slipstream.schedule.agentic import episode_metrics
from slipstream.schedule.ledger import trained_groups
from slipstream.schedule.step_stats import prompt_len_mean
from slipstream.tasks.guard import ERRORS
from slipstream.tasks.rewards import part_means
from slipstream.types import Group, Prompt

if TYPE_CHECKING:
    from pathlib import Path

    from slipstream.config import Config
    from slipstream.engine import Engine
    from slipstream.observe.progress import ProgressView
    from slipstream.observe.rollouts import RolloutWriter
    from slipstream.observe.sinks import FanOut
    from slipstream.observe.timeline import TimelineWriter
    from slipstream.schedule.ledger import Ledger
    from slipstream.schedule.watchdog import Watchdog
    from slipstream.train.trainer import Trainer

# Counters of a run's `counters`, cumulative over the run (the step records report per-step
# deltas); settling and drawing count them (run.setup.Run).
COUNTERS = (
    "tokens/wasted",  # generated tokens that never enter an optimizer step's loss
    "tokens/replayed",  # tokens of replayed samples trained on (generated in an earlier step)
    "replay/samples",  # stored successes mixed into groups with none
    "filters/overlong_masked",  # truncated samples out of the loss (overlong = mask, mask_loss)
    "filters/extra_draws",  # prompts drawn beyond B by dynamic sampling
    "filters/prompts_skipped",  # prompts the pass-rate band did not draw (nothing generated)
    "prompts/skipped_too_long",  # prompts longer than the engine holds with a whole completion
    # samples whose reward raised, was not a finite number, timed out or crashed its worker, and
    # were scored 0 (tasks.guard); counted as groups are settled, so every runtime reports them
    *(f"reward/errors_{kind}" for kind in ERRORS),
)
EMPTY_DRAWS_MAX = 20  # batches in a row with no informative group before the loop gives up


class StepForecast(Protocol):
    """The duration forecast a run may hold (sim.forecast.OnlineForecast)."""

    def observe(self, record: dict[str, Any], eval_in_wall: bool = True) -> dict[str, float]: ...


class SyncRun(Protocol):
    """What the loop and the step record use of a run (`run.setup.Run` is one)."""

    @property
    def cfg(self) -> Config: ...
    @property
    def dir(self) -> Path: ...
    @property
    def trainer(self) -> Trainer: ...
    @property
    def engine(self) -> Engine: ...
    @property
    def eval_engine(self) -> Engine: ...
    @property
    def timeline(self) -> TimelineWriter: ...
    @property
    def view(self) -> ProgressView: ...
    @property
    def sink(self) -> FanOut: ...
    @property
    def rollouts(self) -> RolloutWriter: ...
    @property
    def heldout(self) -> Sequence[Prompt]: ...
    @property
    def eval_metrics(self) -> dict[str, float]: ...
    @property
    def counters(self) -> Counter[str]: ...
    @property
    def ledger(self) -> Ledger: ...
    @property
    def info(self) -> dict[str, Any]: ...
    @property
    def forecast(self) -> StepForecast | None: ...

    def collect(self, n: int) -> tuple[list[Group], list[Group]]: ...

    def evaluate(self, version: int | None = None) -> float: ...


def train_steps(
    run: SyncRun,
    wd: Watchdog | None,
    saved: dict[str, Any],
    save: Callable[[dict[str, Any]], None],
) -> tuple[float, float, float]:
    """The loop on a built run until its version count reaches `run.steps`.

    `wd`: the run's watchdog (its rollback already set) or None. `saved`: the state.json of
    the checkpoint the run was restored from ({} for a fresh run). `save(extra)`: write a
    checkpoint, with the loop's own numbers `extra` (JSON values), when one is due.
    Returns the held-out accuracy at the start and at the end, and the seconds it ran
    (counting on from `saved["wall_s"]`)."""
    cfg = run.cfg
    t_start = time.perf_counter() - saved.get("wall_s", 0.0)
    run.timeline.origin = t_start  # timeline seconds match the metrics' wall_s
    acc_start = saved.get("heldout_acc_start")
    start_eval: dict[str, float] = {}  # the first record's, when the run evaluates at its start
    if acc_start is None:
        t_eval = time.perf_counter()
        acc_start = run.evaluate()
        start_eval[EVAL_START_S] = time.perf_counter() - t_eval
    acc = saved.get("heldout_acc", acc_start)
    held = f"; held-out accuracy at start {acc_start:.3f}" if run.heldout else "; no held-out rows"
    run.view.log(f"run folder {run.dir}{held}")
    empty_draws = 0
    mark, groups = marks(run), []  # counters at the last step record, groups generated since
    step_t0, t_gen = None, 0.0  # since the last step record: its start, generation seconds
    while run.trainer.version < cfg.run.steps:
        t0 = time.perf_counter()
        step_t0 = t0 if step_t0 is None else step_t0
        # 1. draw B prompts, sample a group of each (waits for the longest one) and settle it:
        # advantages and filters; groups with no signal go to the ledger, not the trainer
        new, kept = run.collect(cfg.trainer.batch_prompts)
        groups += new
        t_draw = time.perf_counter() - t0
        t_gen += t_draw  # a batch that trained nothing: its time is the next step's, as its tokens
        run.timeline.interval("sampler0", "generate", t0 - t_start, t0 - t_start + t_draw)
        run.timeline.interval("trainer", "wait", t0 - t_start, t0 - t_start + t_draw)
        if not kept:
            empty_draws = _empty_draw(run, wd, new, empty_draws)
            continue
        empty_draws = 0
        # 2. one optimizer step; the engine samples from the new version from now on
        record, evaluated = _step(run, wd, kept, groups, mark, step_t0, t_gen, t_start)
        step_t0, t_gen = None, 0.0
        acc = acc if evaluated is None else evaluated
        record |= start_eval
        start_eval = {}
        observe_step(run, wd, record, groups, eval_in_wall=True)
        if ends_on_restored_weights(run, record):
            acc = run.evaluate()
        step = record["step"]
        run.sink.write(record)
        run.rollouts.write(step, groups)
        run.view.update(step, record)
        mark, groups = marks(run), []
        if checkpoint_due(run, wd, step):
            extra = {"heldout_acc_start": acc_start, "heldout_acc": acc}
            save({**extra, "wall_s": time.perf_counter() - t_start})
    return acc_start, acc, time.perf_counter() - t_start


def _empty_draw(run: SyncRun, wd: Watchdog | None, new: list[Group], empty_draws: int) -> int:
    """A batch that left nothing to train on: the watchdog sees it (a rollback starts the
    count again); the count of such batches in a row, raising past `EMPTY_DRAWS_MAX`."""
    if wd is not None and wd.observe_empty(new, run.trainer.version) == "rollback":
        return 0
    if empty_draws + 1 > EMPTY_DRAWS_MAX:
        raise RuntimeError(
            f"{EMPTY_DRAWS_MAX} batches in a row had no informative group: check the reward"
        )
    return empty_draws + 1


def _step(
    run: SyncRun,
    wd: Watchdog | None,
    kept: list[Group],
    groups: list[Group],
    mark: dict[str, float],
    t0: float,
    t_gen: float,
    t_start: float,
) -> tuple[dict[str, Any], float | None]:
    """One optimizer step on `kept` and, when due, the evaluation after it: the step record
    (before the watchdog sees it) and the held-out accuracy if it evaluated."""
    cfg = run.cfg
    t1 = time.perf_counter()
    if wd is not None:
        wd.before_step()  # the learning-rate multiplier of tighten / rollback / injection
    metrics = run.trainer.step(kept)
    # tokens in no gradient (dropped by the loss as non-finite, or all of a skipped step's):
    # wasted, so tokens/generated = tokens/trained - tokens/replayed + tokens/wasted holds
    # (run.setup.Run.settle)
    run.counters["tokens/wasted"] += int(metrics["tokens/computed"] - metrics["tokens/trained"])
    run.engine.version = run.eval_engine.version = run.trainer.version
    run.ledger.count_step(kept, metrics)
    t_train = time.perf_counter() - t1
    run.timeline.interval("trainer", "train", t1 - t_start, t1 - t_start + t_train)
    step = run.trainer.version
    t_step = time.perf_counter() - t0  # evaluation is not part of the step's time
    t_eval = 0.0  # in this loop a record's wall_s holds its step's evaluation (observe.clock)
    acc = None
    if step % cfg.eval.every == 0 or step == cfg.run.steps:
        t2 = time.perf_counter()
        with run.timeline.span("trainer", "eval"):
            acc = run.evaluate()
            if run.heldout:  # no held-out rows: no heldout_acc (eval.sets still scored)
                metrics["heldout_acc"] = acc
            metrics.update(run.eval_metrics)  # heldout/pass@1, heldout/mean@n, sets
        t_eval = time.perf_counter() - t2
    record = step_record(run, groups, kept, metrics, mark, t_gen, t_train, t_step, t_start)
    record[EVAL_S] = t_eval
    return record, acc


def marks(run: SyncRun) -> dict[str, float]:
    """Engine and settling counters now; a step record reports the change since its mark, so
    generation of batches that trained nothing is counted in the next record."""
    return {**run.engine.stats.snapshot(), **{k: run.counters[k] for k in COUNTERS}}


def step_record(
    run: SyncRun,
    groups: list[Group],
    kept: list[Group],
    metrics: dict[str, Any],
    mark: dict[str, float],
    t_gen: float,
    t_train: float,
    t_step: float,
    t_start: float,
) -> dict[str, Any]:
    """The step record of the step just trained on `kept`, of `groups` (generated since
    `mark`): its metrics, timings, token and settling counts, lengths, the ledger, episode
    metrics."""
    now = marks(run)
    d = {k: now[k] - mark[k] for k in now}
    lens = [s.num_tokens for g in groups for s in g.samples]
    rewards = [s.reward for g in groups for s in g.samples]
    gen_tokens = d["tokens_generated"]
    return {
        "step": run.trainer.version,
        "version": run.trainer.version,
        "wall_s": time.perf_counter() - t_start,
        "step_time_s": t_step,
        "reward_mean": sum(rewards) / len(rewards),
        **part_means(groups),  # reward/<name> of each reward function (tasks.rewards)
        **metrics,
        "time/generate_s": t_gen,
        "time/train_s": t_train,
        "tokens/generated": gen_tokens,
        **{k: d[k] for k in COUNTERS},  # tokens/wasted, replay/samples, filters/...
        "engine/tokens_per_s": gen_tokens / max(t_gen, 1e-9),
        "train/tokens_per_s": metrics["tokens/computed"] / max(t_train, 1e-9),  # its speed
        "engine/decode_steps": d["decode_steps"],
        "engine/prefill_tokens": d["prefill_tokens"],
        **{f"engine/{k}": d[k] for k in PASS_SUMS},
        "sampler_busy": t_gen / max(t_step, 1e-9),
        # the engine's forwards over the step: below sampler_busy when episodes wait for tools
        "engine/busy_frac": (d["prefill_s"] + d["decode_s"]) / max(t_step, 1e-9),
        "completion_len_mean": sum(lens) / len(lens),
        "completion_len_max": max(lens),
        "completion_lens": lens,
        "prompt_len_mean": prompt_len_mean(groups),
        **run.ledger.flat(),
        **episode_metrics(groups, trained_groups(kept, metrics)),
    }


def observe_step(
    run: SyncRun,
    wd: Watchdog | None,
    record: dict[str, Any],
    groups: list[Group],
    eval_in_wall: bool,
) -> None:
    """A step's record before it is written: the watchdog sees it (and may roll back: the
    version then moves on by one), the duration forecast adds `forecast/*` to it.
    `eval_in_wall`: the record's `wall_s` holds its step's evaluation (this loop), or the
    evaluation comes after it (the orchestrated loops; observe.clock)."""
    if wd is not None:
        wd.observe(record, groups)
        run.info["watchdog"] = wd.summary()
    if run.forecast is not None:  # forecast/remaining_s and its interval
        record |= run.forecast.observe(record, eval_in_wall)


def ends_on_restored_weights(run: SyncRun, record: dict[str, Any]) -> bool:
    """The watchdog rolled back at this step and the run has no step left (an orchestrated
    rollback moves the version on by one): the run ends on the restored weights, which the
    step's evaluation, made before the rollback, did not measure. Logs it."""
    if record.get("watchdog/action") != "rollback" or run.trainer.version < run.cfg.run.steps:
        return False
    run.view.log("watchdog: the run ends on the restored weights; evaluating them")
    return True


def checkpoint_due(run: SyncRun, wd: Watchdog | None, step: int) -> bool:
    """Every `checkpoint.every` steps and at the last, unless the watchdog holds checkpoints
    back (an alarm may still roll back to one before it) before the last step. The last is
    the step after which the version count reached `run.steps`: an orchestrated rollback
    moves it on by one, so a rollback at the step before the last ends the run there."""
    cfg = run.cfg
    last = step == cfg.run.steps or run.trainer.version >= cfg.run.steps
    held = wd is not None and wd.hold_checkpoint() and not last
    return (step % cfg.checkpoint.every == 0 or last) and not held
