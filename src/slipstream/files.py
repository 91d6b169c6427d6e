"""Files written whole or not at all (`write_atomic`): what a run ends with (summary.json,
ledger.json), what a resume rewrites (metrics.jsonl, config.toml), and the small records a
later command reads (the W&B run id, a schedule record's meta.json, replay.json); and the
JSONL files a run writes read back: those it appends to while it runs (metrics.jsonl,
timeline.jsonl), whose last line a kill may cut short (`read_run_jsonl`; `read_run_records`
where every line must be a JSON object), and any of them whole (`read_jsonl`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from slipstream.text import first_line, read_lines


def write_atomic(path: Path, text: str) -> None:
    """`path` holds `text` whole, or what it held before: the text goes to a temporary file in
    the same folder, flushed and fsynced, which then replaces `path` (`os.replace`), so a crash
    or a full disk midway leaves no torn file; a failed write removes the temporary file and
    raises."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)  # the rename itself outlives a crash
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def jsonl_lines(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) of each non-blank line of a JSONL file's `lines`
    (`text.read_lines`: lines end at "\n" only, where str.splitlines() would also split at
    U+2028, U+0085 and other characters legal inside a JSON string, and miscount them)."""
    for n, line in enumerate(lines, start=1):
        if line.strip():
            yield n, line


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The object on each non-blank line of `path`, a JSONL file this program wrote, read a
    line at a time (a bad line raises json.JSONDecodeError; an unreadable file OSError).
    Users' datasets are read by tasks.datasets instead, whose errors name the file and line."""
    return [json.loads(line) for _, line in jsonl_lines(read_lines(path, OSError))]


class JsonLine(NamedTuple):
    """A non-blank line of a JSONL file: its number (from 1, blank lines counted), its text
    (without its "\n"), and its JSON value, or why it is not JSON (`error`; `value` None)."""

    n: int
    text: str
    value: Any
    error: str | None = None


def read_run_jsonl(path: Path, error: type[Exception]) -> tuple[list[JsonLine], bool]:
    """The non-blank lines of `path`, a JSONL file a run appends to (metrics.jsonl,
    timeline.jsonl), and whether its last line was torn. The writer ends each line with its
    "\n", written last, so a run killed mid-write (or still writing) leaves a last line
    without one: when that is not JSON it is left out and `torn` is True (the lines before it
    are whole). Any other line that is not JSON comes back with its `error`, for the caller to
    refuse (the report, the simulator) or skip (a run's own bookkeeping, which a failing
    metrics sink must not stop). Lines end at "\n" only (`text.read_lines`); a file that
    cannot be read or is not UTF-8 raises `error` naming it."""
    lines: list[JsonLine] = []
    last = 0  # the number of the file's last line, blank or not
    for last, text in enumerate(read_lines(path, error), start=1):
        if not text.strip():
            continue
        try:
            lines.append(JsonLine(last, text, json.loads(text)))
        except (ValueError, RecursionError) as e:  # also an int of 4300+ digits, deep nesting
            lines.append(JsonLine(last, text, None, _why(e)))
    torn = bool(lines) and lines[-1].n == last and lines[-1].error is not None
    return (lines[:-1] if torn else lines), torn


def read_run_records(
    path: Path, error: type[Exception]
) -> tuple[list[tuple[int, dict[str, Any]]], bool]:
    """The records of `path`, a JSONL file of one JSON object per line that a run appends to
    (metrics.jsonl), each with its line number, and whether its last line was torn
    (`read_run_jsonl`: left out). Any other line that is not a JSON object raises `error`
    naming the file and line: what the report and the simulator read must be whole."""
    lines, torn = read_run_jsonl(path, error)
    for line in lines:
        if line.error is not None:
            raise error(f"{path}:{line.n}: not valid JSON ({line.error})")
        if not isinstance(line.value, dict):
            raise error(f"{path}:{line.n}: expected a JSON object per line")
    return [(line.n, line.value) for line in lines], torn


def _why(e: Exception) -> str:
    if isinstance(e, json.JSONDecodeError):
        return e.msg
    return "nested too deeply" if isinstance(e, RecursionError) else first_line(e)
