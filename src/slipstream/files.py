"""Files written whole or not at all (`write_atomic`): what a run ends with (summary.json,
ledger.json), what a resume rewrites (metrics.jsonl, config.toml), and the small records a
later command reads (the W&B run id, a schedule record's meta.json, replay.json)."""

from __future__ import annotations

import os
from pathlib import Path


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
