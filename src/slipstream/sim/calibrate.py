"""Calibration: fit the CPU profile from a measured local run, then predict another run.

On a CPU a tiny model's forward pass costs a fixed overhead (Python, kernel launches) plus work
linear in the tokens it processes and in the context they attend to. So one model covers both
a decode step (n sequences, one token each) and a prefill (one pass over a prompt):

    t_forward = a + b * tokens + e * context_tokens

Summed over a step of the run (sampler metrics are sums over sampler processes):

    time/generate_s = a * passes + b * tokens + e * context,   where
      passes  = engine/decode_steps + prefills,   prefills = engine/prefill_tokens / prompt_len
      tokens  = tokens/generated + engine/prefill_tokens
      context = sum over samples of (prompt_len * L + L (L - 1) / 2) + prefills * prompt_len^2 / 2

The context sum does not depend on how sequences were batched: the x-th token of a sample
always attends to prompt_len + x tokens. Training is `time/train_s = c + d * tokens/trained`.
Both are least squares over the run's steps with non-negative coefficients (exact, by trying
every subset of columns: there are three at most). What a step costs beyond generation and
training in a run without overlap (`sync`, `tail_batching`) is the weight sync's latency.

`predict` then simulates a second run from its config.toml with the fitted profile and the
first run's empirical lengths (the same task), and compares step time and sampler busy fraction
with what that run measured. Not modelled: processes of one host competing for cores when
sampling and training overlap; the micro-batch size's effect on training time.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from slipstream.schedule.presets import preset
from slipstream.sim.cost import ModelShape
from slipstream.sim.hardware import HARDWARE, Hardware
from slipstream.sim.lengths import Empirical
from slipstream.sim.runs import RunError, RunRecord, read_run
from slipstream.sim.simulator import Cluster, SimConfig, Workload, simulate


@dataclass
class Calibration:
    """A fitted CPU profile and what the simulator needs to reuse the run's task."""

    hardware: Hardware
    prompt_len: float
    prefills_per_group: float
    source: str
    """The run folder fitted (its lengths are the default length distribution)."""
    fit_error: dict[str, float]
    """In-sample relative RMS error of the generate and train time fits."""


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


def _rel_rms(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((pred - y) ** 2)) / max(np.mean(y), 1e-12))


def _generate_columns(run: RunRecord, prompt: float) -> np.ndarray:
    """[steps, 3]: forward passes, tokens processed, context tokens attended (module doc)."""
    rows = []
    for m in run.metrics:
        lens = np.asarray(m.get("completion_lens") or [], dtype=np.float64)
        prefill = float(m["engine/prefill_tokens"])
        prefills = prefill / prompt if prompt > 0 else 0.0
        if len(lens):
            context = float((prompt * lens + lens * (lens - 1) / 2).sum())
        else:  # no lengths logged: mean length from the counts
            n, mean = (
                run.batch_prompts * run.group_size,
                float(m["tokens/generated"]) / max(1, run.batch_prompts * run.group_size),
            )
            context = n * (prompt * mean + mean * (mean - 1) / 2)
        context += prefills * prompt * prompt / 2
        passes = float(m["engine/decode_steps"]) + prefills
        rows.append((passes, float(m["tokens/generated"]) + prefill, context))
    return np.array(rows)


def fit_profile(run: RunRecord, base: Hardware = HARDWARE["cpu"]) -> Calibration:
    """Fit the CPU profile's measured lines from `run` (module doc)."""
    prompt = run.prompt_len
    X = _generate_columns(run, prompt)
    y_gen = np.array([float(m["time/generate_s"]) for m in run.metrics])
    a, b, e = nonneg_lstsq(X, y_gen)
    T = np.array([[1.0, float(m["tokens/trained"])] for m in run.metrics])
    y_train = np.array([float(m["time/train_s"]) for m in run.metrics])
    c, d = nonneg_lstsq(T, y_train)
    hw = replace(
        base,
        name=f"cpu@{run.path.name}",
        decode_overhead_s=float(a),
        decode_seq_s=float(b),
        decode_ctx_s=float(e),
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
    return Calibration(hw, prompt, run.prefills_per_group, str(run.path), errors)


def sim_config(
    run: RunRecord, cal: Calibration, lengths: Empirical | None = None, seed: int = 0
) -> SimConfig:
    """The simulation of `run`'s configuration on the calibrated profile: its samplers are
    engines of one device, its trainer one device (the local runtime's processes)."""
    if not run.model_info:
        raise RunError(f"{run.path}: no model_info.json and no [model] section")
    model = ModelShape.from_info(run.model_info)
    if lengths is None:
        source = read_run(Path(cal.source), require=("completion_lens",))
        lengths = Empirical.from_steps(source.completion_lens(), source.group_size)
    lengths = Empirical(lengths.groups, max_len=min(lengths.max_len, run.max_new_tokens))
    n = run.num_samplers
    cluster = Cluster(cal.hardware, model, n + 1, n, tp=1, slots=run.max_batch)
    work = Workload(
        run.batch_prompts,
        run.group_size,
        lengths,
        cal.prompt_len,
        prefills_per_group=cal.prefills_per_group,
    )
    lag = run.max_lag if run.schedule in ("async", "pipeline") else None
    # More steps than the run had: the prediction is of the expected step, not of one draw.
    steps = max(len(run.metrics), 200)
    return SimConfig(
        cluster, work, preset(run.schedule, lag), steps=steps, seed=seed, warmup_steps=1
    )


def predict(cal: Calibration, run: RunRecord, lengths: Empirical | None = None) -> dict[str, float]:
    """Predicted and measured step time (s) and sampler busy fraction of `run`, with the
    relative errors. The first step (warm-up) is left out of both."""
    res = simulate(sim_config(run, cal, lengths))
    measured = run.metrics[1:] or run.metrics
    step = float(np.mean([float(m["step_time_s"]) for m in measured]))
    busy = float(np.mean([float(m["sampler_busy"]) for m in measured]))
    pred_step = float(res.step_times_s.mean())
    pred_busy = res.sampler_busy_frac
    return {
        "step_time_s": step,
        "step_time_s_pred": pred_step,
        "step_time_err": pred_step / step - 1,
        "sampler_busy": busy,
        "sampler_busy_pred": pred_busy,
        "sampler_busy_err": pred_busy / busy - 1 if busy > 0 else 0.0,
    }


def save_calibration(cal: Calibration, path: Path) -> None:
    """Write `cal` as JSON (the profile's fields, the prompt shape, the source run)."""
    data = {
        "hardware": asdict(cal.hardware),
        "prompt_len": cal.prompt_len,
        "prefills_per_group": cal.prefills_per_group,
        "source": cal.source,
        "fit_error": cal.fit_error,
    }
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def load_calibration(path: Path) -> Calibration:
    """Read what `save_calibration` wrote; a bad file raises `RunError` naming it."""
    try:
        data = json.loads(Path(path).read_text())
        return Calibration(
            Hardware(**data["hardware"]),
            float(data["prompt_len"]),
            float(data["prefills_per_group"]),
            str(data["source"]),
            dict(data.get("fit_error", {})),
        )
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise RunError(f"{path}: not a calibration file ({e})") from None
