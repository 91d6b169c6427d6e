"""Files written whole or not at all (`write_atomic`): what a run ends with (summary.json,
ledger.json), what a resume rewrites (metrics.jsonl, config.toml), and the small records a
later command reads (the W&B run id, a schedule record's meta.json, replay.json); and the
JSONL files a run writes (metrics.jsonl, a schedule record's event logs) read back
(`read_jsonl`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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


def jsonl_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) of each non-blank line of JSONL `text`. Lines end at "\n"
    only: str.splitlines() would also split at U+2028, U+0085 and other characters that are
    legal inside a JSON string, and miscount the lines."""
    for n, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield n, line


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The object on each non-blank line of `path`, a JSONL file this program wrote (a bad
    line raises json.JSONDecodeError). Users' datasets are read by tasks.datasets instead,
    whose errors name the file and line."""
    return [json.loads(line) for _, line in jsonl_lines(path.read_text(encoding="utf-8"))]
