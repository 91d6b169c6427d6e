"""Files written whole or not at all (`write_atomic`): what a run ends with (summary.json,
ledger.json), what a resume rewrites (metrics.jsonl, config.toml), and the small records a
later command reads (the W&B run id, a schedule record's meta.json, replay.json); and the
JSONL files a run writes (metrics.jsonl, a schedule record's event logs) read back
(`read_jsonl`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from slipstream.text import read_lines


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
