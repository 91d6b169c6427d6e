"""Calibration: fit the CPU profile from a measured local run, then predict another run.

Several runs of one configuration (seeds) calibrate together as one (`runs.pool_runs`: their
steps in turn, their lengths together), which keeps one seed's prompts out of the profile.

On a CPU a tiny model's forward pass costs a fixed overhead (Python, kernel launches) plus work
linear in the rows it computes and in the context they attend to. The local engine runs a
*mixed* step: prompts admitted in a step are prefilled in the same forward as the decode rows,
and each prompt's last row samples its first token. In the in-process loop the whole batch is
admitted at once, so a step's generation is one prefill pass plus `engine/decode_steps`
decode passes (`engine/decode_steps` counts passes with decode rows, not sequences):

    time/generate_s = a * passes + b * rows + e * context,   where
      passes  = engine/decode_steps + 1
      rows    = engine/prefill_tokens + tokens/generated - samples   (first tokens: no row)
      context = sum over samples of (prompt_len * (L-1) + L (L - 1) / 2) + samples * prompt_len^2 / 2

That fit sees step totals only, and across the steps of one configuration passes and rows move
together, so it cannot tell the per-pass cost `a` from the per-row cost `b` (refits of the same
run on this machine put `b` anywhere from 4e-6 to 9e-5 s), and a schedule whose steps have
fewer, fuller passes (continuous batching) is then predicted from the wrong split. So when the
run logged the engine's forward-pass sums (`engine/pass_*`: count, rows, context, seconds and
their products, engine.stats), `a`, `b`, `e` come instead from the forwards themselves:
least squares over every timed forward of `seconds = a + b * rows + e * context`, whose rows
range from the whole batch to one within each step. Generation time outside the forwards (the
sampler's loop, scoring: about 5 % here) is spread over them in proportion (the three are
scaled by `time/generate_s` over the forwards' seconds).

The simulator gives every sample the mean prompt length, so it counts fewer keys read than
the forwards do when prompts vary and longer prompts have longer completions (1.27-1.28x
fewer on the built-in task, whose larger operands make both longer); `e` is scaled by that
ratio, measured on the calibration run's own steps (`context_scale`). Before, a pipeline's
generation was predicted about 10 % short on this machine.

Training is `time/train_s = c + d * tokens/computed`, where `tokens/computed` is the loss
(completion) tokens of the groups the filters kept, the tokens the trainer's passes went over:
unlike `tokens/trained` it holds a skipped step's (a non-finite one still cost its forward and
backward passes) and tokens the loss dropped as non-finite (`computed_tokens`; a run recorded
before the metric existed: `tokens/trained`). The profile also records that share of generated
tokens (`trained_frac`), which the simulator applies to its completions.
`step_time_s` is generation + training (evaluation excluded) and `sampler_busy` is
`time/generate_s / step_time_s`. Both fits are least squares over the run's steps with
non-negative coefficients (exact, by trying every subset of columns: there are three at most).
What a step costs beyond generation and training in a run without overlap (`sync`,
`tail_batching`) is the weight sync's latency.

`predict` then simulates a second run from its config.toml with the fitted profile and the
calibration runs' empirical lengths (the same task), and compares step time and sampler busy
fraction with what that run measured (`predict_runs`: the means of several runs of one
configuration). Each simulation has the run's own number of steps, with the
orchestrator's end of run (`SimConfig.drain`: no more groups admitted than the steps left
train, so the last step waits for its slowest groups with the slots emptying), and the
prediction is the mean of `REPLICATES` of them. Not modelled: processes of one host competing
for cores when sampling and training overlap (on a quiet 2-core host a pipeline's training steps
run 5-15 % slower than the sync run's line gives, hidden behind generation; with another
process on one core, about 2x: bench/sim_calibration.py probes the host for that); the
micro-batch size's effect on training time; a forward's cost departing from its line at row
counts the calibration run never had; what the task's dynamics change between configurations
(completion lengths, the share of tokens the filters keep).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from slipstream.schedule.presets import preset
from slipstream.sim.cost import ModelShape
from slipstream.sim.hardware import HARDWARE, Hardware
from slipstream.sim.lengths import Empirical
from slipstream.sim.runs import RunError, RunRecord, check_one_configuration, pool_runs, read_run
from slipstream.sim.simulator import Cluster, SimConfig, Workload, min_steps, simulate


@dataclass
class Calibration:
    """A fitted CPU profile and what the simulator needs to reuse the run's task."""

    hardware: Hardware
    prompt_len: float
    prefills_per_group: float
    sources: tuple[str, ...]
    """The run folders fitted, one or several of one configuration (`runs.pool_runs`): their
    lengths together are the default length distribution."""
    fit_error: dict[str, float]
    """In-sample relative RMS error of the generate and train time fits."""
    trained_frac: float = 1.0
    """Tokens trained on per token generated (`tokens/computed` / `tokens/generated`): the
    share the filters keep. The trainer's cost line is per such token, so the simulator trains
    this share of the completion tokens it generated."""


def nonneg_lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0, by trying every subset of columns. [n, k], [n]."""
    k = X.shape[1]
    best, best_sse = np.zeros(k), float(y @ y)
    for r in range(1, k + 1):
        for cols in itertools.combinations(range(k), r):
            coef, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
            if (coef < 0).any():
                continue
            sse = float(((X[:, cols] @ coef - y) ** 2).sum())
            if sse < best_sse - 1e-15:
                best, best_sse = np.zeros(k), sse
                best[list(cols)] = coef
    return best


# engine.stats.PASS_SUMS as metric names (spelled out: importing the engine imports torch)
PASS_KEYS = tuple(
    f"engine/pass_{k}"
    for k in ("n", "rows", "ctx", "s", "rows2", "rows_ctx", "ctx2", "rows_s", "ctx_s")
)


def pass_sums(metrics: list[dict[str, Any]]) -> list[float] | None:
    """The run's forward-pass sums (PASS_KEYS, in their order: n, rows, context, seconds and
    the products), summed over its steps; None when a step lacks them."""
    if not metrics or any(k not in m for m in metrics for k in PASS_KEYS):
        return None
    return [sum(float(m[k]) for m in metrics) for k in PASS_KEYS]


def fit_passes(metrics: list[dict[str, Any]]) -> np.ndarray | None:
    """`(a, b, e)` of `seconds = a + b * rows + e * context` over every timed forward of the
    run (least squares, coefficients >= 0), from the summed normal equations the engine logs
    (`engine/pass_*`, engine.stats.PASS_SUMS); None when a step lacks them or there are too
    few forwards."""
    sums = pass_sums(metrics)
    if sums is None:
        return None
    n, r, c, t, rr, rc, cc, rt, ct = sums
    if n < 3:
        return None
    G = np.array([[n, r, c], [r, rr, rc], [c, rc, cc]])
    g = np.array([t, rt, ct])
    scale = np.sqrt(np.maximum(np.diag(G), 1e-30))  # columns of unit norm: rows and
    Gs, gs = G / np.outer(scale, scale), g / scale  # contexts differ by orders of magnitude
    # G = L L^T turns the normal equations back into a least-squares problem with the same
    # minimiser, ||L^T x - L^-1 g||^2 (a jitter of 1e-12 keeps L defined if a column is 0)
    L = np.linalg.cholesky(Gs + 1e-12 * np.eye(3))
    return nonneg_lstsq(L.T, np.linalg.solve(L, gs)) / scale


def context_scale(metrics: list[dict[str, Any]]) -> float:
    """Keys the run's forwards read (`engine/pass_ctx`) over the keys the simulator's
    constant-prompt count gives for the same completions (1.0 when it cannot tell).

    The simulator gives every sample the mean prompt length `P`, so a sample of `L` tokens
    reads `P (P + 1) / 2` keys in its prefill and `(L - 1) P + L (L - 1) / 2` in its decode
    rows (engine.stats.pass_context). Prompt lengths vary, and longer prompts (larger
    operands) have longer completions, so the forwards read more: 1.27-1.28x on the
    built-in task. Only steps whose `completion_lens` account for every row their forwards computed
    are counted (a synchronous run's; an overlapping schedule's steps log the trained groups
    only)."""
    measured = counted = 0.0
    for m in metrics:
        lens = np.asarray(m.get("completion_lens") or [], dtype=np.float64)
        if not len(lens) or "engine/pass_ctx" not in m:
            continue
        prompt = float(m["engine/prefill_tokens"]) / len(lens)
        rows = float((lens - 1).sum()) + float(m["engine/prefill_tokens"])
        if abs(rows - float(m["engine/pass_rows"])) > 0.5:
            continue
        counted += len(lens) * prompt * (prompt + 1) / 2
        counted += float(((lens - 1) * prompt + lens * (lens - 1) / 2).sum())
        measured += float(m["engine/pass_ctx"])
    return measured / counted if counted > 0 else 1.0


def computed_tokens(m: dict[str, Any]) -> float:
    """The tokens a step record's training went over (`tokens/computed`, a skipped step's
    too); in a run recorded before that metric, `tokens/trained`, the same but for tokens the
    loss dropped as non-finite and the steps it skipped."""
    return float(m.get("tokens/computed", m["tokens/trained"]))


def _rel_rms(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((pred - y) ** 2)) / max(np.mean(y), 1e-12))


def _generate_columns(run: RunRecord, prompt: float) -> np.ndarray:
    """[steps, 3]: forward passes, rows computed, context tokens attended (module doc)."""
    rows = []
    for m in run.metrics:
        lens = np.asarray(m.get("completion_lens") or [], dtype=np.float64)
        samples = len(lens) if len(lens) else run.batch_prompts * run.group_size
        prefill = float(m["engine/prefill_tokens"])
        generated = float(m["tokens/generated"])
        if not len(lens):  # no lengths logged: every sample at the mean length
            lens = np.full(samples, generated / max(1, samples))
        decoded = np.maximum(lens - 1, 0)  # the first token comes out of the prefill pass
        context = float((prompt * decoded + decoded * (decoded + 1) / 2).sum())
        context += samples * prompt * prompt / 2
        passes = float(m["engine/decode_steps"]) + 1  # + the pass that prefilled the batch
        rows.append((passes, generated - samples + prefill, context))
    return np.array(rows)


# Fewest steps a saved calibration (`slipstream sim --calibrate`) fits on: one more than the
# generation line's three costs. With as many steps as costs or fewer, least squares passes
# through every step (one step fitted every cost into the per-pass one, with a fit error of
# 0): a profile that looks exact. The run's own forecast (sim.forecast) fits from its third
# step after the warm-up on, as measured; its interval comes from the step times' spread.
MIN_FIT_STEPS = 4


def check_fit_steps(run: RunRecord) -> None:
    """A `RunError` naming `run`'s folders when it has fewer than `MIN_FIT_STEPS` steps."""
    if len(run.metrics) < MIN_FIT_STEPS:
        raise RunError(
            f"{', '.join(str(p) for p in run.paths)}: {len(run.metrics)} step(s) recorded; a "
            f"calibration needs at least {MIN_FIT_STEPS} (more steps, or more runs of the "
            "configuration, fit better)"
        )


def fit_profile(run: RunRecord, base: Hardware = HARDWARE["cpu"]) -> Calibration:
    """Fit the CPU profile's measured lines from `run` (module doc)."""
    prompt = run.prompt_len
    X = _generate_columns(run, prompt)
    y_gen = np.array([float(m["time/generate_s"]) for m in run.metrics])
    a, b, e = nonneg_lstsq(X, y_gen)
    passes = fit_passes(run.metrics)
    if passes is not None:
        pass_s = sum(float(m["engine/pass_s"]) for m in run.metrics)
        a, b, e = passes * (float(y_gen.sum()) / pass_s)
    T = np.array([[1.0, computed_tokens(m)] for m in run.metrics])
    y_train = np.array([float(m["time/train_s"]) for m in run.metrics])
    c, d = nonneg_lstsq(T, y_train)
    generated = sum(float(m["tokens/generated"]) for m in run.metrics)
    trained = sum(computed_tokens(m) for m in run.metrics)
    hw = replace(
        base,
        name=f"cpu@{run.path.name}" + (f"+{len(run.pooled)}" if run.pooled else ""),
        decode_overhead_s=float(a),
        decode_seq_s=float(b),
        decode_ctx_s=float(e) * context_scale(run.metrics),
        prefill_token_s=float(b),
        train_overhead_s=float(c),
        train_token_s=float(d),
    )
    if run.schedule in ("sync", "tail_batching"):
        other = [
            float(m["step_time_s"]) - float(m["time/generate_s"]) - float(m["time/train_s"])
            for m in run.metrics
        ]
        model = ModelShape.from_info(run.model_info) if run.model_info else None
        transfer = model.weight_bytes / base.interconnect_bandwidth if model else 0.0
        hw = replace(hw, sync_latency_s=max(0.0, float(np.median(other)) - transfer))
    errors = {
        "generate": _rel_rms(X @ np.array([a, b, e]), y_gen),
        "train": _rel_rms(T @ np.array([c, d]), y_train),
    }
    frac = trained / generated if generated > 0 else 1.0
    sources = tuple(str(p) for p in run.paths)
    return Calibration(hw, prompt, run.prefills_per_group, sources, errors, frac)


def run_lengths(run: RunRecord) -> Empirical:
    """The completion lengths `run` produced (every pooled run's), as whole groups."""
    return Empirical.from_steps(run.completion_lens(), run.group_size)


def source_lengths(cal: Calibration) -> Empirical:
    """The completion lengths of the runs `cal` was fitted on (read from their folders)."""
    return run_lengths(
        pool_runs([read_run(Path(p), require=("completion_lens",)) for p in cal.sources])
    )


def sim_config(
    run: RunRecord, cal: Calibration, lengths: Empirical | None = None, seed: int = 0
) -> SimConfig:
    """The simulation of `run`'s configuration on the calibrated profile: its samplers are
    engines of one device, its trainer one device (the local runtime's processes)."""
    if not run.model_info:
        raise RunError(f"{run.path}: no model_info.json and no [model] section")
    model = ModelShape.from_info(run.model_info)
    if lengths is None:
        lengths = source_lengths(cal)
    lengths = Empirical(lengths.groups, max_len=min(lengths.max_len, run.max_new_tokens))
    n = run.num_samplers
    cluster = Cluster(cal.hardware, model, n + 1, n, tp=1, slots=run.max_batch)
    work = Workload(
        run.batch_prompts,
        run.group_size,
        lengths,
        cal.prompt_len,
        prefills_per_group=cal.prefills_per_group,
        trained_frac=cal.trained_frac,
    )
    lag = run.max_lag if run.schedule in ("async", "pipeline") else None
    warmup = 1
    return SimConfig(
        cluster,
        work,
        preset(run.schedule, lag),
        steps=max(len(run.metrics), min_steps(warmup)),
        seed=seed,
        lag_policy=run.lag_policy,
        warmup_steps=warmup,
        drain=True,
    )


REPLICATES = 64
"""Simulations of a run's own length that `predict` averages: the prediction is of the
expected run, not of one draw of lengths. Until stop 41 there were 8, and the mean of 8 moved
by 0.9-1.4 % (standard deviation over sets of replicate seeds) on tests/data/simcal's targets,
a Monte Carlo error in every out-of-sample figure; 64 take it to about 0.4 % for at most a
second a prediction (a simulation of 30 steps takes 1-16 ms on this machine's CPU)."""


def predict(
    cal: Calibration,
    run: RunRecord,
    lengths: Empirical | None = None,
    replicates: int = REPLICATES,
) -> dict[str, float]:
    """Predicted and measured step time (s) and sampler busy fraction of `run`, with the
    relative errors. The first step (warm-up) is left out of both.

    Each simulation runs as many steps as `run` had, so its first steps (the pipeline
    filling) and its last ones (admission bounded by the steps left: the samplers drain with
    fewer and fewer sequences) weigh in the mean as they do in the measured run; the mean of
    `replicates` simulations (seeds 0, 1, ...) is the prediction."""
    if lengths is None:  # read once, not once per replicate
        lengths = source_lengths(cal)
    results = [simulate(sim_config(run, cal, lengths, seed=i)) for i in range(replicates)]
    measured = run.metrics[1:] or run.metrics
    step = float(np.mean([float(m["step_time_s"]) for m in measured]))
    busy = float(np.mean([float(m["sampler_busy"]) for m in measured]))
    pred_step = float(np.mean([r.step_times_s.mean() for r in results]))
    pred_busy = float(np.mean([r.sampler_busy_frac for r in results]))
    return {
        "step_time_s": step,
        "step_time_s_pred": pred_step,
        "step_time_err": pred_step / step - 1,
        "sampler_busy": busy,
        "sampler_busy_pred": pred_busy,
        "sampler_busy_err": pred_busy / busy - 1 if busy > 0 else 0.0,
    }


def predict_runs(
    cal: Calibration,
    runs: Sequence[RunRecord],
    lengths: Empirical | None = None,
    replicates: int = REPLICATES,
) -> dict[str, float]:
    """`predict` of several runs of one configuration (seeds; `check_one_configuration`): the mean of their predictions against the mean of what they measured, each run
    weighing alike, in `predict`'s keys. One run gives `predict`'s figures."""
    check_one_configuration(runs)
    if lengths is None:  # read once, not once per run
        lengths = source_lengths(cal)
    per = [predict(cal, r, lengths, replicates) for r in runs]
    out: dict[str, float] = {}
    for k, err in (("step_time_s", "step_time_err"), ("sampler_busy", "sampler_busy_err")):
        measured = float(np.mean([p[k] for p in per]))
        pred = float(np.mean([p[k + "_pred"] for p in per]))
        out |= {k: measured, f"{k}_pred": pred, err: pred / measured - 1 if measured > 0 else 0.0}
    return out


def save_calibration(cal: Calibration, path: Path) -> None:
    """Write `cal` as JSON (the profile's fields, the prompt shape, the source runs)."""
    data = {
        "hardware": asdict(cal.hardware),
        "prompt_len": cal.prompt_len,
        "prefills_per_group": cal.prefills_per_group,
        "sources": list(cal.sources),
        "fit_error": cal.fit_error,
        "trained_frac": cal.trained_frac,
    }
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def load_calibration(path: Path) -> Calibration:
    """Read what `save_calibration` wrote (a file with one `source`, as written before
    pooling, too); a bad file raises `RunError` naming it."""
    try:
        data = json.loads(Path(path).read_text())
        sources = data["sources"] if "sources" in data else [data["source"]]
        return Calibration(
            Hardware(**data["hardware"]),
            float(data["prompt_len"]),
            float(data["prefills_per_group"]),
            tuple(str(p) for p in sources),
            dict(data.get("fit_error", {})),
            float(data.get("trained_frac", 1.0)),
        )
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise RunError(f"{path}: not a calibration file ({e})") from None
