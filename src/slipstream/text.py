"""Users' text: reading their files (configs, task rows) with errors that name the file and the
byte, and their values shortened for a one-line message."""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path, error: type[Exception]) -> str:
    """The UTF-8 text of `path` without a leading BOM (not part of the first line or key);
    a file that is not UTF-8, or cannot be read, raises `error` naming the path."""
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror})") from None


def is_text(s: str) -> bool:
    """False for a string no encoder can take (a lone surrogate, e.g. from JSON '\\ud800')."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def clip(s: str, n: int = 120) -> str:
    """`s`, or its first `n - 3` characters and `...`."""
    return s if len(s) <= n else s[: n - 3] + "..."


def first_line(e: BaseException, n: int = 200) -> str:
    """An exception's message for a one-line error: its first line (clipped to `n`), or its
    type's name when it has none."""
    lines = str(e).strip().splitlines()
    return clip(lines[0], n) if lines else type(e).__name__


def short_repr(value: object, n: int = 120) -> str:
    """`repr(value)` clipped to `n` characters; `?` where a user type's `__repr__` raises."""
    try:
        return clip(repr(value), n)
    except Exception:
        return "?"
