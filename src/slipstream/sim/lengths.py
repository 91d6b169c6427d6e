"""Completion-length distributions: what the samplers will be asked to generate, in tokens.

Every distribution draws whole groups, `lengths_P_G[p, g]` for prompt p and group member g,
because members of a group share a prompt and their lengths are correlated (a hard problem
makes every attempt long). It also returns `expected_P`, the length a tail-batching orchestrator
would predict for each prompt from what it generated before: the prompt's true mean blurred by
a lognormal prediction error.

- `Lognormal`: the usual shape of reasoning lengths; `prompt_share` of the log-variance is
  between prompts, the rest within a group.
- `HeavyTail`: a lognormal body and a Pareto tail (agentic and long reasoning runs, where the
  slowest 20 % take 25-32x the median).
- `Straggler`: the published straggler figure (99 % of samples finish by `p99`, the last 1 %
  spread up to `tail_max`), stratified so that its maximum is exactly `tail_max`.
- `Empirical`: the groups a run produced, read from its `metrics.jsonl`, resampled whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from statistics import NormalDist

import numpy as np

Z99 = 2.3263478740408408  # standard normal 99th percentile
DEFAULT_MAX_LEN = 16384
"""The cut of a `lognormal` or `heavy` spec without `max=` (tokens)."""


class LengthDist:
    """Base class: `sample` draws groups; `mean` and `residual_mean` summarise the draw."""

    max_len: int
    stratified = False
    """True when one draw is built to hold exact quantiles: batches are then drawn one by one."""

    def sample(
        self, rng: np.random.Generator, n_groups: int, group_size: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """`lengths_P_G` (int64, tokens) and `expected_P` (float, predicted mean length)."""
        raise NotImplementedError

    @cached_property
    def _moments(self) -> tuple[float, float]:
        lengths, _ = self.sample(np.random.default_rng(12345), 4096, 4)
        flat = lengths.astype(np.float64).ravel()
        return float(flat.mean()), float((flat**2).mean())

    @property
    def mean(self) -> float:
        """Mean completion length, tokens."""
        return self._moments[0]

    @property
    def residual_mean(self) -> float:
        """Mean completion tokens held by a busy slot at a random moment: E[L^2] / (2 E[L]).

        A slot spends time in proportion to length, so the sequence it holds is length-biased,
        and is on average half done (renewal theory)."""
        m1, m2 = self._moments
        return m2 / (2 * m1)


def _clip(x: np.ndarray, max_len: int) -> np.ndarray:
    return np.clip(np.rint(x), 1, max_len).astype(np.int64)


@dataclass
class Lognormal(LengthDist):
    """Lognormal lengths with `median` (tokens) and log-space `sigma`, cut at `max_len`."""

    median: float
    sigma: float
    max_len: int
    prompt_share: float = 0.5
    """Fraction of the log-variance that is between prompts (shared by a group)."""
    predict_noise: float = 0.3
    """Log-space error of the tail-batching length prediction."""

    def sample(
        self, rng: np.random.Generator, n_groups: int, group_size: int
    ) -> tuple[np.ndarray, np.ndarray]:
        s_p = self.sigma * np.sqrt(self.prompt_share)
        s_w = self.sigma * np.sqrt(1 - self.prompt_share)
        mu_P = np.log(self.median) + s_p * rng.standard_normal(n_groups)
        log_L = mu_P[:, None] + s_w * rng.standard_normal((n_groups, group_size))
        expected_P = np.exp(mu_P + s_w**2 / 2 + self.predict_noise * rng.standard_normal(n_groups))
        return _clip(np.exp(log_L), self.max_len), expected_P


@dataclass
class HeavyTail(Lognormal):
    """A `Lognormal` body; a fraction `tail_frac` of samples instead follows a Pareto tail of
    index `alpha` starting at the body's 99th percentile."""

    tail_frac: float = 0.05
    alpha: float = 1.5

    def sample(
        self, rng: np.random.Generator, n_groups: int, group_size: int
    ) -> tuple[np.ndarray, np.ndarray]:
        lengths, expected = super().sample(rng, n_groups, group_size)
        start = self.median * np.exp(Z99 * self.sigma)
        tail = rng.random(lengths.shape) < self.tail_frac
        pareto = start * rng.random(lengths.shape) ** (-1.0 / self.alpha)
        return np.where(tail, _clip(pareto, self.max_len), lengths), expected


@dataclass
class Straggler(LengthDist):
    """99 % of lengths below `p99` (lognormal body of log-sigma `sigma`), the last
    `tail_frac` evenly spread from `p99` up to exactly `tail_max`. Tokens."""

    stratified = True
    p99: float
    tail_max: int
    sigma: float = 0.42
    tail_frac: float = 0.01

    @property
    def max_len(self) -> int:  # type: ignore[override]
        return self.tail_max

    def sample(
        self, rng: np.random.Generator, n_groups: int, group_size: int
    ) -> tuple[np.ndarray, np.ndarray]:
        n = n_groups * group_size
        k = max(1, round(self.tail_frac * n))
        # Stratified quantiles of the body, cut at its 99th percentile.
        u = (np.arange(n - k) + rng.random(n - k)) / (n - k)
        median = self.p99 / np.exp(Z99 * self.sigma)
        body = median * np.exp(self.sigma * _norm_ppf(np.clip(0.99 * u, 1e-9, None)))
        tail = self.p99 + (self.tail_max - self.p99) * np.arange(1, k + 1) / k
        lengths = _clip(rng.permutation(np.concatenate([body, tail])), self.tail_max)
        lengths_P_G = lengths.reshape(n_groups, group_size)
        return lengths_P_G, lengths_P_G.mean(axis=1).astype(np.float64)


@dataclass
class Empirical(LengthDist):
    """Lengths a run produced: `groups` of completion lengths (tokens), resampled whole when
    their size matches the requested group size, one by one otherwise."""

    groups: list[np.ndarray]
    max_len: int = 0
    predict_noise: float = 0.3
    flat: np.ndarray = field(init=False, repr=False)
    matrix: np.ndarray | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("empirical length distribution needs at least one group")
        self.flat = np.concatenate(self.groups).astype(np.int64)
        sizes = {len(g) for g in self.groups}
        self.matrix = np.stack(self.groups).astype(np.int64) if len(sizes) == 1 else None
        self.max_len = self.max_len or int(self.flat.max())

    @classmethod
    def from_steps(cls, lens_per_step: list[list[int]], group_size: int) -> Empirical:
        """From each step's `completion_lens`, stored group by group (G consecutive values)."""
        groups: list[np.ndarray] = []
        for lens in lens_per_step:
            arr = np.asarray(lens, dtype=np.int64)
            usable = len(arr) - len(arr) % group_size
            groups.extend(arr[:usable].reshape(-1, group_size))
        return cls(groups)

    def sample(
        self, rng: np.random.Generator, n_groups: int, group_size: int
    ) -> tuple[np.ndarray, np.ndarray]:
        if self.matrix is not None and self.matrix.shape[1] == group_size:
            lengths = self.matrix[rng.integers(len(self.matrix), size=n_groups)]
        else:
            lengths = rng.choice(self.flat, size=(n_groups, group_size))
        lengths = np.minimum(lengths, self.max_len)
        noise = np.exp(self.predict_noise * rng.standard_normal(n_groups))
        return lengths, lengths.mean(axis=1) * noise


_norm_ppf = np.vectorize(NormalDist().inv_cdf, otypes=[np.float64])
"""Standard normal quantile, elementwise."""

_RULES: dict[str, tuple[Callable[[float], bool], str]] = {
    "max": (lambda v: v >= 1, ">= 1"),
    "median": (lambda v: v > 0, "> 0"),
    "p99": (lambda v: v > 0, "> 0"),
    "alpha": (lambda v: v > 0, "> 0"),
    "sigma": (lambda v: v >= 0, ">= 0"),
    "tail": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "prompt_share": (lambda v: 0 <= v <= 1, "in [0, 1]"),
}
"""What each `parse_lengths` key must be, and how to say it."""


def check_lengths_keys(spec: str, kv: dict[str, float]) -> None:
    """Raise a one-line ValueError naming the first key of `kv` out of its range."""
    for k, v in kv.items():
        ok, text = _RULES[k]
        if not (math.isfinite(v) and ok(v)):
            raise ValueError(f"lengths {spec!r}: {k} must be {text}, got {v:g}")
    if "p99" in kv and "max" in kv and kv["p99"] >= kv["max"]:
        raise ValueError(f"lengths {spec!r}: p99 must be below max")


def parse_lengths(spec: str) -> LengthDist:
    """A distribution from a CLI string, e.g. `lognormal:median=2000,sigma=0.8,max=16384`,
    `heavy:median=800,sigma=0.6,tail=0.05,alpha=1.5,max=32768`,
    `straggler:p99=4000,max=12000`, or `empirical:RUN_DIR` (reads its metrics.jsonl).
    `lognormal` and `heavy` are cut at `DEFAULT_MAX_LEN` without `max`; `straggler` needs it
    (its tail's end)."""
    kind, _, rest = spec.partition(":")
    if kind == "empirical":
        from slipstream.sim.runs import read_run

        run = read_run(Path(rest))
        return Empirical.from_steps(run.completion_lens(), run.group_size)
    try:
        kv = {k.strip(): float(v) for k, v in (p.split("=") for p in rest.split(",") if p)}
    except ValueError:
        raise ValueError(f"lengths {spec!r}: expected KIND:key=value,... (numbers)") from None
    allowed = {
        "lognormal": {"median", "sigma", "max", "prompt_share"},
        "heavy": {"median", "sigma", "max", "tail", "alpha", "prompt_share"},
        "straggler": {"p99", "max", "sigma", "tail"},
    }
    if kind not in allowed:
        raise ValueError(f"lengths {spec!r}: kind must be lognormal, heavy, straggler or empirical")
    unknown = set(kv) - allowed[kind]
    if unknown:
        raise ValueError(f"lengths {spec!r}: unknown key(s) {', '.join(sorted(unknown))}")
    check_lengths_keys(spec, kv)
    try:
        if kind == "straggler":
            return Straggler(kv["p99"], int(kv["max"]), kv.get("sigma", 0.42), kv.get("tail", 0.01))
        median, sigma, max_len = kv["median"], kv["sigma"], int(kv.get("max", DEFAULT_MAX_LEN))
        share = kv.get("prompt_share", 0.5)
        if kind == "heavy":
            tail, alpha = kv.get("tail", 0.05), kv.get("alpha", 1.5)
            return HeavyTail(median, sigma, max_len, share, tail_frac=tail, alpha=alpha)
        return Lognormal(median, sigma, max_len, share)
    except KeyError as e:
        raise ValueError(f"lengths {spec!r}: missing key {e.args[0]}") from None
