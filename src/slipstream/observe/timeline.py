"""Busy and idle intervals of each actor, for the report's timeline (why pipelining wins).

`timeline.jsonl` in the run folder holds one line per interval:

    {"actor": "sampler0", "kind": "generate", "t0": 1.25, "t1": 3.50}

`actor` is `sampler<N>` or `trainer` (any short name works); `kind` is one of `KINDS`; `t0`
and `t1` are seconds since the run started. Time not covered by an interval is idle. `wait`
marks idle time whose cause is known (the trainer waiting for a batch, a sampler waiting for
weights), so the figure can tell it apart; `blocked` is a sampler waiting for room in the full
group queue (backpressure from the trainer).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from slipstream.files import read_run_jsonl
from slipstream.observe.sinks import JsonlSink, SafeSink

KINDS = ("generate", "train", "weight_sync", "eval", "wait", "blocked", "down")
"""Interval kinds; all but `wait`, `blocked` (a sampler holding a finished group while the
group queue is full: not generating) and `down` (a dead sampler until its replacement is
ready) count as busy."""

BUSY_KINDS = frozenset(KINDS) - {"wait", "blocked", "down"}


@dataclass(frozen=True)
class Interval:
    actor: str
    kind: str
    t0: float
    t1: float

    @property
    def busy(self) -> bool:
        return self.kind in BUSY_KINDS


class TimelineWriter:
    """Appends intervals to `run_dir/timeline.jsonl`; a write failure warns once, never raises.

    `origin` is the `time.perf_counter()` reading the run counts from (default: now), used by
    `span`; `interval` takes seconds since the start directly.
    """

    def __init__(self, run_dir: str | Path, origin: float | None = None) -> None:
        self.origin = time.perf_counter() if origin is None else origin
        self._sink = SafeSink(JsonlSink(Path(run_dir) / "timeline.jsonl"), "timeline")

    def interval(self, actor: str, kind: str, t0: float, t1: float) -> None:
        if kind not in KINDS:
            # A typo here would silently vanish from the figure: refuse it loudly.
            raise ValueError(f"timeline kind {kind!r}: expected one of {', '.join(KINDS)}")
        self._sink.write({"actor": actor, "kind": kind, "t0": round(t0, 6), "t1": round(t1, 6)})

    @contextlib.contextmanager
    def span(self, actor: str, kind: str) -> Iterator[None]:
        """Records the time the body takes as one interval."""
        t0 = time.perf_counter() - self.origin
        try:
            yield
        finally:
            self.interval(actor, kind, t0, time.perf_counter() - self.origin)

    def close(self) -> None:
        self._sink.close()


def read_timeline(path: str | Path) -> list[Interval]:
    """Intervals of a `timeline.jsonl`. A torn last line (a live run writing it, or a run
    killed mid-write: `files.read_run_jsonl`) is skipped, as `observe.runs.read_metrics` skips
    one; any other malformed line, or a file that cannot be read, raises ValueError naming
    file and line."""
    out = []
    path = Path(path)
    for line in read_run_jsonl(path, ValueError)[0]:
        n, d = line.n, line.value
        if line.error is not None:
            raise _bad_line(path, n, line.text, line.error)
        try:
            iv = Interval(str(d["actor"]), str(d["kind"]), float(d["t0"]), float(d["t1"]))
        except (ValueError, KeyError, TypeError) as e:
            raise _bad_line(path, n, line.text, str(e)) from None
        if iv.t1 < iv.t0:
            raise ValueError(f"{path}:{n}: interval ends before it starts (t0 {iv.t0}, t1 {iv.t1})")
        out.append(iv)
    return out


def _bad_line(path: Path, n: int, line: str, why: str) -> ValueError:
    return ValueError(
        f"{path}:{n}: expected {{actor, kind, t0, t1}}, got {line.strip()[:80]!r} ({why})"
    )


def busy_fraction(intervals: list[Interval], actor: str, start: float, end: float) -> float:
    """Share of [start, end] the actor spent in busy intervals (overlaps counted once)."""
    spans = sorted(
        (max(i.t0, start), min(i.t1, end)) for i in intervals if i.actor == actor and i.busy
    )
    covered, reach = 0.0, start
    for a, b in spans:
        a = max(a, reach)
        if b > a:
            covered += b - a
            reach = b
    return covered / (end - start) if end > start else 0.0
