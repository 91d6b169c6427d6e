"""The report's figures, one function each: runs in, a matplotlib Figure out.

Figures are built with the object API on the Agg canvas (no pyplot, no global state, no
display). Every function draws all runs it is given, one colour per run, so several runs
(the five schedules of `bench schedules`) overlay for comparison. A figure whose data a run
lacks says so in the figure instead of vanishing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from slipstream.observe.runs import RunData
from slipstream.observe.timeline import busy_fraction

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
KIND_COLORS = {
    "generate": "#4c9be8",
    "train": "#f28e2b",
    "weight_sync": "#9467bd",
    "eval": "#b0b0b0",
    "wait": "#f6c9c9",
    "blocked": "#e15759",
    "down": "#222222",
}
# Schedules whose samplers never run ahead of the trainer: every token has lag 0 and the
# importance ratio is 1 (docs/design.md, the presets' table), so their staleness needs no recording.
ON_POLICY = {"sync", "tail_batching"}
TIMELINE_STEPS = 12  # the timeline shows the first steps: enough to see the rhythm, still legible

REWARD = ("reward/mean", "reward_mean")
HELDOUT = ("eval/heldout_acc", "heldout_acc")


def _figure(rows: int = 1, cols: int = 2, height: float = 3.2) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(10, height * rows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def _note(ax: Axes, text: str) -> None:
    ax.text(
        0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#555555", wrap=True
    )


def _legend(ax: Axes) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, frameon=False)


def _color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def _curve_pair(
    runs: list[RunData], keys: tuple[str, ...], ylabel: str, title: str, start_key: str | None
) -> Figure:
    """`keys` against wall time (left) and against generated tokens (right), all runs."""
    fig, (by_time, by_tokens) = _figure()
    for i, run in enumerate(runs):
        pts = run.values(*keys)
        if not pts:
            continue
        tokens = dict(zip((id(r) for r in run.metrics), run.generated_tokens()))
        xs_t = [float(r.get("wall_s", 0)) for r, _ in pts]
        xs_n = [tokens[id(r)] for r, _ in pts]
        ys = [v for _, v in pts]
        start = (run.summary or {}).get(start_key) if start_key else None
        if isinstance(start, int | float):  # the measurement before the first step
            xs_t, xs_n, ys = [0.0, *xs_t], [0.0, *xs_n], [float(start), *ys]
        style: dict[str, Any] = {
            "color": _color(i),
            "marker": "o",
            "markersize": 3,
            "linewidth": 1.5,
            "label": run.label,
        }
        by_time.plot(xs_t, ys, **style)
        by_tokens.plot(xs_n, ys, **style)
    if not any(run.has(*keys) for run in runs):
        for ax in (by_time, by_tokens):
            _note(ax, f"no {ylabel} recorded")
    by_time.set(xlabel="wall time (s)", ylabel=ylabel, title=f"{title} against wall time")
    by_tokens.set(
        xlabel="generated tokens", ylabel=ylabel, title=f"{title} against generated tokens"
    )
    for ax in (by_time, by_tokens):
        ax.grid(alpha=0.3)
    _legend(by_time)
    return fig


def reward_figure(runs: list[RunData]) -> Figure:
    return _curve_pair(runs, REWARD, "mean reward", "Training reward", None)


def heldout_figure(runs: list[RunData]) -> Figure:
    return _curve_pair(runs, HELDOUT, "held-out accuracy", "Held-out accuracy", "heldout_acc_start")


def _lag_distribution(run: RunData) -> tuple[np.ndarray, str] | None:
    """Share per lag 0, 1, ... and what it counts, from the best data the run has."""
    counts = [
        r["staleness/lag_hist"]
        for r in run.metrics
        if isinstance(r.get("staleness/lag_hist"), list)
    ]
    if counts:
        total = np.zeros(max(len(c) for c in counts))
        for c in counts:
            total[: len(c)] += np.asarray(c, dtype=float)
        return total / max(total.sum(), 1), "tokens"
    lag_max = [int(v) for _, v in run.values("staleness/lag_max")]
    if lag_max:
        return np.bincount(lag_max) / len(lag_max), "steps, by their max lag"
    if run.schedule in ON_POLICY:
        return np.array([1.0]), "tokens (on-policy: lag 0)"
    return None


def lag_figure(runs: list[RunData]) -> Figure:
    fig, (ax,) = _figure(cols=1)
    width = 0.8 / max(len(runs), 1)
    missing = []
    for i, run in enumerate(runs):
        dist = _lag_distribution(run)
        if dist is None:
            missing.append(run.label)
            continue
        share, what = dist
        xs = np.arange(len(share)) - 0.4 + width * (i + 0.5)
        ax.bar(xs, share, width=width, color=_color(i), label=f"{run.label} ({what})")
    if missing:
        _note(ax, f"no staleness recorded: {', '.join(missing)}")
    ax.set(xlabel="lag (trainer version − token version)", ylabel="share", title="Lag histogram")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(axis="y", alpha=0.3)
    _legend(ax)
    return fig


def ess_figure(runs: list[RunData]) -> Figure:
    fig, (ax,) = _figure(cols=1)
    for i, run in enumerate(runs):
        for key, style, name in (
            ("staleness/ess_token", "-", "token"),
            ("staleness/ess_seq", "--", "sequence"),
        ):
            pts = run.values(key)
            if pts:
                ax.plot(
                    [float(r.get("wall_s", 0)) for r, _ in pts],
                    [v for _, v in pts],
                    linestyle=style,
                    color=_color(i),
                    label=f"{run.label} · {name}",
                )
        if not run.has("staleness/ess_token", "staleness/ess_seq") and run.schedule in ON_POLICY:
            # On-policy: every importance ratio is 1, so the effective sample size is all of it.
            ax.axhline(
                1.0, linestyle=":", color=_color(i), label=f"{run.label} · on-policy (ESS 1)"
            )
    if not ax.lines:
        _note(ax, "no effective sample size recorded")
    ax.set(
        xlabel="wall time (s)",
        ylabel="ESS / n",
        title="Effective sample size of the importance weights",
        ylim=(0, 1.05),
    )
    ax.grid(alpha=0.3)
    _legend(ax)
    return fig


def _actor_order(name: str) -> tuple[int, int, str]:
    m = re.fullmatch(r"sampler(\d+)", name)
    if m:
        return (0, int(m.group(1)), name)
    return (1 if name == "trainer" else 2, 0, name)


def _timeline_window(run: RunData) -> tuple[float, float, bool]:
    """[start, end] of the first TIMELINE_STEPS trainer steps; True when cut short."""
    start = min(iv.t0 for iv in run.timeline)
    end = max(iv.t1 for iv in run.timeline)
    trains = sorted(iv.t1 for iv in run.timeline if iv.kind == "train")
    if len(trains) > TIMELINE_STEPS:
        return start, trains[TIMELINE_STEPS - 1], True
    return start, end, False


def timeline_figure(runs: list[RunData]) -> Figure:
    """Busy and idle time of each sampler and the trainer, one panel per run, shared x."""
    with_data = [r for r in runs if r.timeline]
    n_rows = [len({iv.actor for iv in r.timeline}) for r in with_data]
    fig, axes = _figure(rows=max(len(with_data), 1), cols=1, height=0.6 + 0.45 * max(n_rows or [2]))
    if not with_data:
        _note(axes[0], "no timeline.jsonl in " + ", ".join(r.label for r in runs))
        axes[0].set_axis_off()
        return fig
    windows = [_timeline_window(r) for r in with_data]
    x_end = max(end for _, end, _ in windows)
    for ax, run, (start, end, cut) in zip(axes, with_data, windows):
        actors = sorted({iv.actor for iv in run.timeline}, key=_actor_order)
        full_end = max(iv.t1 for iv in run.timeline)
        for y, actor in enumerate(actors):
            for kind, color in KIND_COLORS.items():
                spans = [
                    (iv.t0, iv.t1 - iv.t0)
                    for iv in run.timeline
                    if iv.actor == actor and iv.kind == kind and iv.t0 < end
                ]
                if spans:
                    # white edges keep back-to-back intervals (one per batch) apart
                    ax.broken_barh(
                        spans, (y - 0.35, 0.7), facecolors=color, edgecolors="white", linewidth=0.5
                    )
        labels = [
            f"{a} ({100 * busy_fraction(run.timeline, a, start, full_end):.0f}% busy)"
            for a in actors
        ]
        ax.set_yticks(range(len(actors)), labels, fontsize=8)
        ax.set_ylim(-0.6, len(actors) - 0.4)
        ax.invert_yaxis()
        ax.set_xlim(start, x_end)
        title = f"{run.label} ({run.schedule})" + (f": first {TIMELINE_STEPS} steps" if cut else "")
        ax.set_title(title, fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("wall time (s); white = idle")
    handles = [Patch(color=c, label=k) for k, c in KIND_COLORS.items()]
    axes[0].legend(
        handles=handles,
        fontsize=8,
        ncols=len(handles),
        loc="lower right",
        bbox_to_anchor=(1, 1.02),
        frameon=False,
    )
    return fig


LEDGER_COLORS = {
    "trained": "#2ca02c",
    "stale": "#ff7f0e",
    "aborted": "#d62728",
    "lost": "#000000",
    "poisoned": "#7b2d8e",
    "unfinished": "#c7c7c7",
    "discarded": "#8c564b",
    "in_flight": "#9ecae1",
}
"""Every counter of `Ledger.settled()` but `trained` and `filtered` (drawn apart), and
`in_flight`: a balanced ledger's bar adds up to `generated`."""
FILTERED_COLORS = ["#8c8c8c", "#b5b5b5", "#6b6b6b", "#d0d0d0"]


def ledger_figure(runs: list[RunData]) -> Figure:
    """Where every generated group ended, as one stacked bar per run."""
    fig, (ax,) = _figure(cols=1, height=0.9 + 0.5 * len(runs))
    seen: set[str] = set()
    for y, run in enumerate(runs):
        led = run.final_ledger()
        if led is None:
            ax.text(0, y, "  no ledger recorded", va="center", color="#555555")
            continue
        parts = [("trained", led.get("trained", 0), LEDGER_COLORS["trained"])]
        for j, (reason, n) in enumerate(sorted((led.get("filtered") or {}).items())):
            parts.append((f"filtered: {reason}", n, FILTERED_COLORS[j % len(FILTERED_COLORS)]))
        parts += [(k, led.get(k, 0), c) for k, c in LEDGER_COLORS.items() if k != "trained"]
        left = 0.0
        for name, n, color in parts:
            if not n:
                continue
            ax.barh(y, n, left=left, color=color, label=None if name in seen else name)
            seen.add(name)
            left += n
        balanced = led.get("balanced")
        mark = "" if balanced is None else ("  balanced" if balanced else "  NOT BALANCED")
        ax.text(
            left, y, f" {int(led.get('generated', left))} groups{mark}", va="center", fontsize=8
        )
    ax.set_yticks(range(len(runs)), [r.label for r in runs], fontsize=9)
    ax.invert_yaxis()
    ax.set(xlabel="groups", title="Ledger: where every generated group ended")
    ax.margins(x=0.15)
    if seen:
        fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    return fig


def lengths_figure(runs: list[RunData]) -> Figure:
    """Completion lengths per step: median and max (the straggler that a sync step waits for)."""
    fig, (ax,) = _figure(cols=1)
    for i, run in enumerate(runs):
        rows = [
            r
            for r in run.metrics
            if isinstance(r.get("completion_lens"), list) and r["completion_lens"]
        ]
        if rows:
            steps = [r.get("step", j + 1) for j, r in enumerate(rows)]
            med = [float(np.median(r["completion_lens"])) for r in rows]
            top = [max(r["completion_lens"]) for r in rows]
        else:
            pts = run.values("completion_len_mean")
            steps, med = [r.get("step", j + 1) for j, (r, _) in enumerate(pts)], [v for _, v in pts]
            top = [r.get("completion_len_max", float("nan")) for r, _ in pts]
        if steps:
            ax.plot(
                steps,
                med,
                color=_color(i),
                label=f"{run.label} · median" if rows else f"{run.label} · mean",
            )
            ax.plot(steps, top, color=_color(i), linestyle=":", label=f"{run.label} · max")
    if not ax.lines:
        _note(ax, "no completion lengths recorded")
    ax.set(xlabel="step", ylabel="tokens", title="Completion length per step")
    ax.grid(alpha=0.3)
    _legend(ax)
    return fig


FIGURES: dict[str, tuple[str, Callable[[list[RunData]], Figure]]] = {
    "reward.png": ("Training reward", reward_figure),
    "heldout.png": ("Held-out accuracy", heldout_figure),
    "timeline.png": ("Timeline: busy and idle", timeline_figure),
    "lag.png": ("Staleness: lag histogram", lag_figure),
    "ess.png": ("Effective sample size", ess_figure),
    "lengths.png": ("Completion lengths", lengths_figure),
    "ledger.png": ("Ledger", ledger_figure),
}
"""File name -> (section title, figure function), in page order."""


def save(fig: Figure, path: Path) -> None:
    fig.savefig(path, format="png")
