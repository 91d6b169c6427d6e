"""Users' text: reading their files (configs, task rows) with errors that name the file and the
byte, and their values shortened for a one-line message."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

BOM = b"\xef\xbb\xbf"


def read_text(path: Path, error: type[Exception]) -> str:
    """The UTF-8 text of `path` without a leading BOM (not part of the first line or key);
    a file that is not UTF-8, or cannot be read, raises `error` naming the path."""
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror})") from None


def read_lines(path: Path, error: type[Exception]) -> Iterator[str]:
    """The lines of `path` as `read_text(path, error).split("\n")` gives them, read one at a
    time: a file of millions of rows is never held whole (as bytes, text and list of lines)
    beside what is made of it. Lines end at "\n" only, as JSON lines do (a "\r" before it is
    kept): `str.splitlines()` would also end one at U+2028 or U+0085, legal inside a JSON
    string, and a text-mode file (unless opened with `newline="\n"`) at a lone "\r". As with
    split, a file that ends with "\n" (or is empty) ends with a line "": so a last line that
    is not blank is one its writer did not finish (`files.read_run_jsonl`). Read as bytes, so
    that an error names the byte as `read_text`'s does (counted after a BOM)."""
    at = 0  # bytes before this line, a leading BOM left out
    ended = True  # the lines so far ended with "\n" (none yet: the "" of an empty file)
    try:
        with path.open("rb") as f:
            for n, raw in enumerate(f):  # a binary file's lines end at b"\n" only
                if n == 0 and raw.startswith(BOM):
                    raw = raw[len(BOM) :]
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    reason = f"{e.reason} at byte {at + e.start}"
                    raise error(f"{path}: not UTF-8 text ({reason})") from None
                at += len(raw)
                ended = line.endswith("\n")
                yield line.removesuffix("\n")
        if ended:
            yield ""
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
