"""How long a run has left, with a 90 % interval, from the simulator calibrated on the run itself.

At step k of N, from the step records written so far (the rows of metrics.jsonl):

1. calibrate: `calibrate.fit_profile` on the rows after the first (the warm-up step) gives the
   CPU profile (generation a + b rows + e context per pass, fitted on the engine's forwards
   when the rows carry their sums; training c + d trained tokens);
2. simulate the run's own config (schedule, batch, group size, samplers) with that profile,
   once with the completion lengths of every row (mu_obs) and once with those of the newest
   half (mu_new): lengths drift as the policy learns, and the simulator turns that drift into
   step time;
3. set the level on what the run measured: the remaining steps are expected to take
   `mean(step_time_s) x mu_new / mu_obs` each (the simulator's ratio corrects the measured pace
   for the newer lengths; its absolute error, e.g. from processes sharing cores, cancels);
4. add the wall time a step record holds besides its step: the evaluations still due before
   the last record (every `eval.every` steps and at the last, at the measured duration of
   one, the one at the start included; the in-process loop times a record after its step's
   evaluation, the orchestrated loops before it, so theirs are those of steps k to N - 1:
   `evals_left`), the checkpoints still due before the last step (every `checkpoint.every`
   steps, at the measured duration of one) and the per-step overhead (median of `wall_s`
   increments minus `step_time_s` on steps without evaluation or checkpoint).

A resumed run's forecast goes on from the steps before the resume: `OnlineForecast.resume`
takes them back from metrics.jsonl and the length ratio from the checkpoint.

The interval: step times are not independent (a busy machine slows a stretch of steps), and
their level wanders (lengths drift as the policy learns, the machine's load changes). So log
step times (rows after the first) are modelled as AR(1) noise around a level that moves as a
random walk: the AR(1) variance and lag-1 correlation fitted on the run (`log_ar1`), the random
walk's variance per step from the run's variogram (`log_drift`). The relative variance of the
remaining time is that of the observed mean (the level's error) plus that of the mean of the
steps left (the future's own noise), plus how far the level of the steps left may move from
the observed steps' (`var_of_level_change`), taken as log-normal with a Student-t quantile on
n_obs - 2 degrees of freedom. On synthetic series (tests/test_sim_forecast.py: forecasts at
25 % of 80 steps) it covers 94.5 % of independent steps and 91.8 % at correlation 0.5 (93.8
and 87.0 % without the drift term); on series whose level wanders (a random walk of 0.04 a
step under noise of 0.15) 60.5 % (38.5 % without it): below 90 %, since a drift estimated
from a few tens of steps is itself uncertain. It does not cover a change of the machine's
load that the observed steps give no hint of. Without the drift term the interval held 67-80 %
of the forecasts on the built-in task (docs/measurements.md, the run-duration forecast).
"""

from __future__ import annotations

import itertools
import json
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from slipstream.sim.calibrate import PASS_KEYS, Calibration, fit_profile, sim_config
from slipstream.sim.lengths import Empirical
from slipstream.sim.runs import REQUIRED_METRICS, RunRecord
from slipstream.sim.simulator import SimConfig, simulate

# One-sided 95 % quantiles of Student's t (a two-sided 90 % interval), by degrees of freedom.
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833}
T95 |= {10: 1.812, 12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697, 60: 1.671}
Z95 = 1.645
MODEL_ERROR = 0.24
"""The simulator's largest relative error on step time out of sample, as measured on this
workplace's 2-core CPUs on a host not known to be busy (bench/sim_calibration.py, README "Plan
a cluster run"), calibrated on one run: the pipeline at batch 32 missed by 23.1 % on one of
stop 41's nine single-seed calibrations (seed 2 of recording s41c, its forward line +20.9 %;
22.7 % on one of four recordings at stop 25, 21.8 % on an earlier CPU's; at most 11.9 % on six
recordings of seed 0 at stop 32), rounded up: `slipstream plan` widens its interval by it.
Stop 31's 36.9 % (0.37 here until stop 32) came from recordings on a host with another process
on one core (the pipeline's training at half speed, reproduced with a busy loop). No cluster
measurement exists yet."""


def t95(dof: int) -> float:
    """The quantile for `dof` degrees of freedom (the nearest tabled dof below; 1.645 past 60)."""
    if dof > 60:
        return Z95
    return T95[max(d for d in T95 if d <= max(dof, 1))]


def interval_quantile(lengths: Sequence[int]) -> float:
    """The quantile of the 90 % interval of a log mean step time whose AR(1) noise was fitted
    on series of these lengths (`log_ar1_within`): Student's t on their steps less the fitted
    parameters, one mean per series and the correlation. The in-run forecast (one series of n
    steps: n - 2 degrees of freedom) and `slipstream plan` (one series per seed) both use it."""
    return t95(sum(lengths) - len(lengths) - 1)


@dataclass(frozen=True)
class Forecast:
    """Seconds from now to the run's last step: expected, and a 90 % interval."""

    remaining_s: float
    lo_s: float
    hi_s: float
    step_s: float
    """Expected time of one remaining step (without evaluation and overhead)."""
    rel_sd: float
    """Relative standard deviation of the remaining steps' mean time (module doc)."""

    def as_metrics(self, wall_s: float) -> dict[str, float]:
        return {
            "forecast/remaining_s": self.remaining_s,
            "forecast/remaining_lo_s": self.lo_s,
            "forecast/remaining_hi_s": self.hi_s,
            "forecast/end_s": wall_s + self.remaining_s,
        }


def var_of_mean(var: float, rho: float, n: int) -> float:
    """Variance of the mean of n terms of an AR(1) series of variance `var`, lag-1
    correlation `rho`: var / n (1 + 2 sum_k (1 - k/n) rho^k)."""
    k = np.arange(1, max(n, 1))
    return var / max(n, 1) * (1 + 2 * float(np.sum((1 - k / n) * rho**k)))


def var_of_pooled_mean(var: float, rho: float, lengths: list[int]) -> float:
    """Variance of the mean of independent AR(1) series (`var`, `rho`) of these lengths, all
    their terms pooled: sum_i (m_i / n)^2 var_of_mean(var, rho, m_i), n = sum_i m_i."""
    n = sum(lengths)
    return sum((m / n) ** 2 * var_of_mean(var, rho, m) for m in lengths if m > 0)


def log_ar1(x: np.ndarray) -> tuple[float, float]:
    """(variance, lag-1 correlation) of log x [n], both corrected for a short series: the
    correlation's bias (1 + 4 rho) / n (Kendall), clipped to [0, 0.95]; the variance, the sum
    of squares about the mean over n, divided by 1 - var_of_mean(1, rho, n) (a correlated
    series' squares miss the spread of its own mean: ss / (n - 1) when uncorrelated)."""
    return log_ar1_within([x])


def log_ar1_within(series: Sequence[np.ndarray]) -> tuple[float, float]:
    """`log_ar1` of independent series of one AR(1) process, fitted within each series only:
    each log series about its own mean, the lag-1 products summed within series (none across
    the joins between them, which pair the end of one series with the start of the next).
    Corrected as `log_ar1`, for k series of n steps in all: the pooled correlation's bias
    k (1 + 4 rho) / n (each series' own, (1 + 4 rho) / m, weighted by its m / n); the variance
    the sum of squares over n, divided by 1 - the steps' mean of var_of_mean(1, rho, m) (a
    series' squares about its own mean miss that mean's spread: their expectation is
    m var (1 - var_of_mean(1, rho, m)); uncorrelated, the familiar n - k of k fitted means).
    One series: `log_ar1`. (0, 0) with fewer than 2 degrees of freedom or no spread."""
    ys = [np.log(np.asarray(x, dtype=np.float64)) for x in series if len(x) > 0]
    ys = [y - y.mean() for y in ys]
    n, k = sum(len(y) for y in ys), len(ys)
    ss = sum(float(y @ y) for y in ys)
    if n - k < 2 or ss <= 0:
        return 0.0, 0.0
    rho = sum(float(y[1:] @ y[:-1]) for y in ys) / ss
    rho = min(max(rho + k * (1 + 4 * rho) / n, 0.0), 0.95)
    own = sum(len(y) * var_of_mean(1.0, rho, len(y)) for y in ys) / n
    var = ss / n / max(1 - own, 0.2)
    return var, rho


RHO_GRID = np.linspace(0.0, 0.8, 17)
"""AR(1) correlations `log_drift` tries. It stops at 0.8: a correlation above that levels off
only after tens of lags, rising over a forecast's horizon as a random walk does, and counts
as drift (a grid up to 0.95 finds 7-15 % less of the drift of random walks of 19 to 400 steps,
mean of 100 each)."""


def log_drift(x: np.ndarray, max_lag: int = 50) -> float:
    """Variance per step of the random-walk level of log x [n] (a local-level model's q):
    0 with fewer than 8 steps, where a drift cannot be told from noise.

    The semivariogram of AR(1) noise of variance s2 and correlation rho around such a level is
    g(d) = half the mean square of y[t + d] - y[t] = c + s2 (1 - rho^d) + q d / 2 (c: white
    noise beyond the AR(1)): the AR(1) part levels off within a few lags, the random walk keeps
    rising. Fitted by least squares over lags 1 .. min(n / 2, max_lag), each lag weighted by
    its pairs, coefficients >= 0 (every subset of the three columns, as
    calibrate.nonneg_lstsq, solved for all rho of RHO_GRID at once): the best fit's q."""
    y = np.log(np.asarray(x, dtype=np.float64))
    n = len(y)
    if n < 8:
        return 0.0
    lags = np.arange(1, max(3, min(n // 2, max_lag)) + 1)
    g = np.array([0.5 * float(np.mean((y[d:] - y[:-d]) ** 2)) for d in lags])
    w = (n - lags).astype(np.float64)
    X = np.stack(  # [rho, lag, column]
        [
            np.ones((len(RHO_GRID), len(lags))),
            1 - RHO_GRID[:, None] ** lags,
            np.broadcast_to(lags / 2, (len(RHO_GRID), len(lags))),
        ],
        axis=2,
    )
    G = np.einsum("rlc,l,rld->rcd", X, w, X)
    b = np.einsum("rlc,l,l->rc", X, w, g)
    gg = float(w @ (g * g))  # the sum of squares with every coefficient 0
    best_sse, best_q = gg, 0.0
    for r in range(1, 4):
        for cols in itertools.combinations(range(3), r):
            c = list(cols)
            # pinv: at rho = 0 the AR(1) column is the constant one (min-norm, as lstsq)
            coef = np.einsum("rij,rj->ri", np.linalg.pinv(G[:, c][:, :, c]), b[:, c])  # [rho, r]
            sse = gg - np.einsum("rc,rc->r", coef, b[:, c])
            sse[(coef < 0).any(axis=1)] = math.inf
            i = int(np.argmin(sse))
            if sse[i] < best_sse - 1e-15:
                best_sse, best_q = float(sse[i]), float(coef[i, c.index(2)]) if 2 in c else 0.0
    return best_q


def var_of_level_change(q: float, n: int, h: int) -> float:
    """Variance of the mean level of the next `h` steps minus that of the last `n` observed,
    for a random-walk level of variance `q` per step: q ((n - 1)(2n - 1) / 6n + (h + 1)(2h + 1)
    / 6h) (the weights of each step's increment, summed in squares: (i - 1) / n for the
    observed steps' and j / h for the future's)."""
    if n <= 0 or h <= 0:
        return 0.0
    return q * ((n - 1) * (2 * n - 1) / (6 * n) + (h + 1) * (2 * h + 1) / (6 * h))


def increments(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Step -> wall_s increment beyond the step's own time (the first row: its wall clock)."""
    over = {int(rows[0]["step"]): float(rows[0]["wall_s"]) - float(rows[0]["step_time_s"])}
    for prev, row in itertools.pairwise(rows):
        step = int(row["step"])
        over[step] = float(row["wall_s"]) - float(prev["wall_s"]) - float(row["step_time_s"])
    return over


def _near(s: int, every: int) -> bool:
    """Step s's increment may hold the work done after step s - 1 or s every `every` steps."""
    return every > 0 and s % every in (0, 1 % every)


def eval_cost(
    rows: list[dict[str, Any]], eval_every: int, ckpt_every: int = 0
) -> tuple[float, float]:
    """(seconds of one evaluation, per-step overhead) from wall_s increments (module doc, 4).
    The evaluation after step e lands in the increment of step e (the sync loop times its
    record after evaluating) or of step e + 1 (the async learner, before): the larger of the two
    counts; the first row's wall clock beyond its step is the evaluation at the start when that
    row is step 1 (a resumed run's first row holds the clock of the steps before it and no
    evaluation: it is left out). Steps next to no evaluation and no checkpoint (every
    `ckpt_every` steps, 0: none) give the overhead; evaluations away from checkpoints are
    measured when there are any."""
    over, first = increments(rows), int(rows[0]["step"])
    plain = [
        v
        for s, v in over.items()
        if s != first and not _near(s, eval_every) and not _near(s, ckpt_every)
    ]
    overhead = max(float(np.median(plain)), 0.0) if plain else 0.0
    at = [s for s in over if s % eval_every == 0 and s != first]
    alone = [s for s in at if not _near(s, ckpt_every)]  # no checkpoint after s - 1 or s
    evals = [over[first]] if first == 1 else []
    evals += [max(over[s], over.get(s + 1, over[s])) for s in (alone or at)]
    if not evals:
        return 0.0, overhead
    return max(float(np.median(evals)) - overhead, 0.0), overhead


def ckpt_cost(rows: list[dict[str, Any]], ckpt_every: int, eval_every: int) -> float:
    """Seconds of one checkpoint: the loops save after writing step c's record, so it lands in
    the increment of step c + 1; median over the checkpoints away from evaluations (one next to
    an evaluation is in that evaluation's increment), less the overhead; 0 when none seen."""
    if ckpt_every <= 0:
        return 0.0
    over, first = increments(rows), int(rows[0]["step"])
    _, overhead = eval_cost(rows, eval_every, ckpt_every)
    seen = [
        over[c + 1]
        for c in over
        if c % ckpt_every == 0 and c + 1 in over and c + 1 != first
        if not (_near(c, eval_every) or _near(c + 1, eval_every))
    ]
    return max(float(np.median(seen)) - overhead, 0.0) if seen else 0.0


def sim_step_s(
    run: RunRecord, cal: Calibration, lens: list[list[int]], steps: int, seeds: int
) -> float:
    """Mean simulated step time of `run`'s config on the profile `cal`, with `lens`
    (steady steps: no end of run, `SimConfig.drain` off)."""
    lengths = Empirical.from_steps(lens, run.group_size)
    out = []
    for seed in range(seeds):
        cfg = replace(sim_config(run, cal, lengths, seed=seed), steps=steps, drain=False)
        out.append(float(simulate(cfg).step_times_s.mean()))
    return float(np.mean(out))


def length_ratio(run: RunRecord, sim_steps: int = 40, seeds: int = 2) -> float:
    """mu_new / mu_obs of the module doc (2), on the rows after the first; 1 without lengths.
    Both simulations use one profile, fitted once on those rows."""
    body = RunRecord(run.path, run.config, run.model_info, run.metrics[1:])
    lens = [r["completion_lens"] for r in body.metrics if r.get("completion_lens")]
    if len(lens) < 2:
        return 1.0
    cal = fit_profile(body)
    newest = sim_step_s(body, cal, lens[len(lens) // 2 :], sim_steps, seeds)
    return newest / sim_step_s(body, cal, lens, sim_steps, seeds)


def evals_left(step: int, total_steps: int, eval_every: int, eval_in_wall: bool = True) -> int:
    """Evaluations between the record of `step` and the last record (of step `total_steps`):
    every `eval_every` steps and at the last. `eval_in_wall`: a record's `wall_s` holds its
    step's evaluation (the in-process loop: steps after `step`, the last included), else the
    evaluation follows the record (the orchestrated loops: `step` itself and the steps up to
    the last, the last's own coming after the last record; observe.clock)."""
    due = [s for s in range(1, total_steps + 1) if s % eval_every == 0 or s == total_steps]
    if eval_in_wall:
        return sum(1 for s in due if s > step)
    return sum(1 for s in due if step <= s < total_steps)


def forecast(
    run: RunRecord,
    total_steps: int,
    eval_every: int,
    ratio: float | None = None,
    ckpt_every: int = 0,
    eval_in_wall: bool = True,
) -> Forecast | None:
    """The forecast after the rows of `run` (module doc); None before four steps (three
    after the warm-up: the least that gives the spread a degree of freedom). `ratio`:
    a `length_ratio` computed earlier (the simulations are the costly part). `ckpt_every`:
    the run's `checkpoint.every` (0: no checkpoints); those still due before the last step
    are added at their measured cost. `eval_in_wall`: as for `evals_left`."""
    rows = run.metrics
    step = int(rows[-1]["step"])
    left = max(total_steps - step, 0)
    body = rows[1:]  # the first step fills the pipeline and warms the caches
    if len(body) < 3:
        return None
    x = np.array([float(r["step_time_s"]) for r in body])
    step_s = float(x.mean()) * (length_ratio(run) if ratio is None else ratio)
    evaluation, overhead = eval_cost(rows, eval_every, ckpt_every)
    # saved after the record of step c, so within the time left for c in [step, last)
    ckpts_left = sum(1 for c in range(step, total_steps) if ckpt_every and c % ckpt_every == 0)
    var, rho = log_ar1(x)
    n = len(x)
    rel_var = var_of_mean(var, rho, n) + var_of_mean(var, rho, left)
    rel_var += var_of_level_change(log_drift(x), n, left)
    rel_sd = math.sqrt(rel_var) if left else 0.0
    q = interval_quantile([n]) * rel_sd
    steps_part = left * step_s
    fixed = evals_left(step, total_steps, eval_every, eval_in_wall) * evaluation + left * overhead
    fixed += ckpts_left * ckpt_cost(rows, ckpt_every, eval_every)
    return Forecast(
        steps_part + fixed,
        steps_part * math.exp(-q) + fixed,
        steps_part * math.exp(q) + fixed,
        step_s,
        rel_sd,
    )


NEEDED = ("step", "wall_s", *(m for m in REQUIRED_METRICS[1:] if m != "sampler_busy"))
KEEP = (*NEEDED, "prompt_len_mean", "completion_lens", "tokens/computed", *PASS_KEYS)
"""The keys of a step record the forecast reads: the calibration's (`sim.runs`) but the
sampler's busy share, which a forecast does not use, with the wall clock (NEEDED); and when
present, the lengths, the tokens the trainer computed on (its line is fitted on them) and the
engine's forward-pass sums (the decode line is fitted from them: sim.calibrate)."""


class OnlineForecast:
    """Forecasts as a run goes: `observe(record)` after each step record returns the
    `forecast/*` metrics to add to it ({} before the fourth step). The simulations (the length
    ratio) are redone every `every` steps; the rest at every step.

    `run_dir` is the run's folder: its config.toml and model_info.json (written before the
    first step) describe the run to the simulator, as for `slipstream sim --calibrate`."""

    def __init__(
        self, run_dir: Path, total_steps: int, eval_every: int, every: int, ckpt_every: int = 0
    ) -> None:
        self.run_dir = Path(run_dir)
        self.total, self.eval_every, self.every = total_steps, eval_every, max(1, every)
        self.ckpt_every = ckpt_every
        self.rows: list[dict[str, Any]] = []
        self.ratio: float | None = None
        self._head: tuple[dict[str, Any], dict[str, Any]] | None = None

    def _run(self) -> RunRecord:
        if self._head is None:
            config = tomllib.loads((self.run_dir / "config.toml").read_text())
            info = json.loads((self.run_dir / "model_info.json").read_text())
            self._head = config, info
        return RunRecord(self.run_dir, *self._head, self.rows)

    def _keep(self, record: dict[str, Any]) -> bool:
        """Take the record's row if it has what the forecast reads; whether it had."""
        if any(k not in record for k in NEEDED):
            return False
        self.rows.append({k: record[k] for k in KEEP if k in record})
        return True

    def observe(self, record: dict[str, Any], eval_in_wall: bool = True) -> dict[str, float]:
        """The record's `forecast/*` ({} before the fourth row). `eval_in_wall`: whether the
        record's `wall_s` holds its step's evaluation (`evals_left`)."""
        if not self._keep(record) or len(self.rows) < 4:
            return {}
        try:
            run = self._run()
            if self.ratio is None or int(record["step"]) % self.every == 0:
                self.ratio = length_ratio(run)
            result = forecast(
                run, self.total, self.eval_every, self.ratio, self.ckpt_every, eval_in_wall
            )
        except (OSError, ValueError, KeyError, TypeError, np.linalg.LinAlgError):
            # RunError is a ValueError. A forecast never stops a run: this step has none.
            return {}
        return {} if result is None else result.as_metrics(float(record["wall_s"]))

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (JSON): the length ratio; the rows are metrics.jsonl's."""
        return {"ratio": self.ratio}

    def resume(self, records: list[dict[str, Any]], state: dict[str, Any] | None) -> None:
        """Go on after a resume: `records`, the run's step records up to its checkpoint (its
        metrics.jsonl, which the forecast observed as they were made), and `state`, the
        checkpoint's `state_dict()` (None: a checkpoint from before it was kept, the ratio
        is simulated again at the next step). The next step's forecast is then the one the
        unbroken run would have made from the same records."""
        self.rows = []
        for r in records:
            self._keep(r)
        self.ratio = None if state is None else state.get("ratio")


def plan_forecast(
    cfg: SimConfig, run_steps: int, model_error: float, seeds: int = 3, sim_steps: int = 12
) -> Forecast:
    """Before a run (`slipstream plan`): its duration for `run_steps` steps under `cfg`, with
    a 90 % interval. The simulator's own spread (step times over `seeds` length draws from
    `cfg.seed` on (`slipstream plan --seed`), log AR(1) as in `forecast`, fitted within each
    seed's series: `log_ar1_within`): the relative variance of the run's mean step is that of
    the simulated mean, estimated from the `seeds` independent series (its error does not
    shrink with the run's length), plus that of the mean of the run's `run_steps` steps (their
    own noise), taken as log-normal with the in-run forecast's Student-t quantile
    (`interval_quantile`). Widened by the model's
    error: the interval is [lo / (1 + model_error), hi x (1 + model_error)], where
    `model_error` is what the simulator was measured to miss out of sample
    (bench/sim_calibration.py)."""
    times: list[np.ndarray] = []
    for seed in range(cfg.seed, cfg.seed + seeds):
        c = replace(cfg, steps=min(run_steps, sim_steps) + cfg.warmup_steps, seed=seed)
        times.append(simulate(c).step_times_s)
    lengths = [len(t) for t in times]
    var, rho = log_ar1_within(times)
    step_s = float(np.concatenate(times).mean())
    rel_var = var_of_pooled_mean(var, rho, lengths)
    rel_var += var_of_mean(var, rho, run_steps)
    q = interval_quantile(lengths) * math.sqrt(rel_var)
    total = step_s * run_steps
    band = 1 + model_error
    lo, hi = total * math.exp(-q) / band, total * math.exp(q) * band
    return Forecast(total, lo, hi, step_s, math.sqrt(rel_var))
