"""Live progress in the terminal (rich), or plain lines in quiet mode.

The view reads whatever the step record holds: a field shows when its key is present, so the
sync loop and the async runtime share one view. Names follow `stage/quantity`; the older flat
names the sync loop writes (`reward_mean`, `heldout_acc`, `sampler_busy`) are read too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from rich.columns import Columns
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from slipstream.observe.means import number
from slipstream.observe.metrics import resolve


def _num(record: Mapping[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = number(record.get(k))
        if v is not None:
            return v
    return None


def fmt_duration(seconds: float) -> str:
    """`1h02m`, `3m05s`, `42s`; `?` for a value that is not a finite number (the live view
    must not stop a run on a NaN forecast)."""
    if not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _ledger(r: Mapping[str, Any]) -> str | None:
    if _num(r, "ledger/generated") is None:
        return None
    parts = [f"{int(_num(r, 'ledger/generated') or 0)} gen"]
    for k in ("trained", "filtered", "stale", "aborted", "lost", "poisoned", "discarded"):
        v = _num(r, f"ledger/{k}")
        # the others are rare: show them only once they happen (`discarded`: a rollback's)
        if v is not None and (v or k in ("trained", "filtered")):
            parts.append(f"{int(v)} {k}")
    return " · ".join(parts)


def _pair(r: Mapping[str, Any], a: str, b: str, fa: str, fb: str) -> str | None:
    x, y = _num(r, a), _num(r, b)
    if x is None and y is None:
        return None
    return f"{'-' if x is None else format(x, fa)} / {'-' if y is None else format(y, fb)}"


def _one(
    keys: tuple[str, ...], fmt: Callable[[float], str]
) -> Callable[[Mapping[str, Any]], str | None]:
    def get(r: Mapping[str, Any]) -> str | None:
        v = _num(r, *keys)
        return None if v is None else fmt(v)

    return get


FIELDS: list[tuple[str, Callable[[Mapping[str, Any]], str | None]]] = [
    ("version", _one(("version",), lambda v: f"v{v:.0f}")),
    ("reward", _one(("reward/mean", "reward_mean"), lambda v: f"{v:.3f}")),
    ("held-out acc", _one(("eval/heldout_acc", "heldout_acc"), lambda v: f"{v:.3f}")),
    ("gen tok/s", _one(("engine/tokens_per_s",), lambda v: f"{v:,.0f}")),
    ("train tok/s", _one(("train/tokens_per_s",), lambda v: f"{v:,.0f}")),
    ("lag mean/max", lambda r: _pair(r, "staleness/lag_mean", "staleness/lag_max", ".2f", ".0f")),
    ("ESS tok/seq", lambda r: _pair(r, "staleness/ess_token", "staleness/ess_seq", ".3f", ".3f")),
    ("sampler busy", _one(("runtime/sampler_busy", "sampler_busy"), _pct)),
    ("trainer wait", _one(("runtime/trainer_wait",), _pct)),
    ("queue", _one(("queue/depth",), lambda v: f"{v:.0f}")),
    ("ledger", _ledger),
]
"""(label, reader) of each field of the view, in display order."""


def fields(record: Mapping[str, Any], eta_s: float | None = None) -> list[tuple[str, str]]:
    """The (label, text) pairs the record supports, ETA last: the run's forecast with its 90 %
    interval when the record has one (`forecast/*`, slipstream.sim.forecast), else `eta_s`."""
    out = [(label, text) for label, get in FIELDS if (text := get(record)) is not None]
    rem = _num(record, "forecast/remaining_s")
    lo, hi = _num(record, "forecast/remaining_lo_s"), _num(record, "forecast/remaining_hi_s")
    if rem is not None and lo is not None and hi is not None:
        out.append(("ETA", f"{fmt_duration(rem)} (90%: {fmt_duration(lo)}-{fmt_duration(hi)})"))
    elif eta_s is not None:
        out.append(("ETA", fmt_duration(eta_s)))
    return out


class _Stats:
    """The fields under the bar; rich re-renders them on every refresh."""

    def __init__(self) -> None:
        self.pairs: list[tuple[str, str]] = []

    def __rich__(self) -> Group:
        cells = [Text.assemble((label, "dim"), " ", text) for label, text in self.pairs]
        # The long ledger line gets its own row, so the short fields pack tightly; Columns flows
        # them to the terminal's width without cutting one in two.
        short = [c for c, (label, _) in zip(cells, self.pairs) if label != "ledger"]
        return Group(Columns(short, padding=(0, 3)), *[c for c in cells if c not in short])


class ProgressView:
    """Shows step, version, reward, held-out accuracy, throughput, staleness, utilisation,
    queue, ledger and ETA as a run goes. `quiet`, or no terminal to draw on (output to a file
    or a pipe: a cluster job's log, CI): one plain line per evaluation and at the end, since a
    live display writes only its last frame there."""

    def __init__(self, total: int, title: str, quiet: bool = False) -> None:
        self.console = Console(stderr=True)
        self.quiet = quiet = quiet or not (self.console.is_terminal or self.console.is_jupyter)
        self.total = total
        self._acc: float | None = None
        self._t0 = time.perf_counter()
        self._first: tuple[float, int] | None = None  # (time, step) of the first update
        self._stats = _Stats()
        self._progress: Progress | None = None
        self._live: Live | None = None
        if not quiet:
            self._progress = Progress(
                TextColumn(f"[bold]{title}[/]"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._task = self._progress.add_task(title, total=total)
            # One Live holds the bar and the table (rich allows one live display at a time).
            self._live = Live(
                Group(self._progress, self._stats), console=self.console, refresh_per_second=4
            )
            self._live.start()

    def log(self, message: str) -> None:
        # soft_wrap: a log line stays one line in files and CI logs, whatever the width
        self.console.print(message, markup=False, highlight=False, soft_wrap=True)

    def eta(self, step: int, now: float | None = None) -> float | None:
        """Seconds left at the mean pace since the first update (setup and warm start excluded)."""
        now = time.perf_counter() if now is None else now
        if self._first is None:
            self._first = (now, step)
            return None
        t1, s1 = self._first
        if step <= s1:
            return None
        return (now - t1) / (step - s1) * max(self.total - step, 0)

    def update(self, step: int, record: dict[str, Any]) -> None:
        r = resolve(record)
        acc = _num(r, "eval/heldout_acc", "heldout_acc")
        evaluated = acc is not None
        if evaluated:
            self._acc = acc
        elif self._acc is not None:  # held-out accuracy is measured now and then: keep the last
            r["heldout_acc"] = self._acc
        pairs = fields(r, self.eta(step))
        if self._progress is not None:
            self._stats.pairs = pairs
            self._progress.update(self._task, completed=step)
        elif evaluated or step == self.total:
            elapsed = time.perf_counter() - self._t0
            text = " · ".join(f"{label} {value}" for label, value in pairs)
            self.log(f"step {step}/{self.total} · {text} · elapsed {fmt_duration(elapsed)}")

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
            if not self.console.is_terminal:  # (a file or a pipe) its last frame ends mid-line
                self.console.line()
