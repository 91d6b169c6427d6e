"""JSON lines are read a line at a time (`read_lines`): the rows and errors of the whole-text
reading they replace (lines end at "\\n" only), and a peak memory of about the rows alone."""

from __future__ import annotations

import gc
import json
import tracemalloc

import pytest

from slipstream.tasks import TaskError
from slipstream.tasks.datasets import read_table

BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize(
    ("data", "rows"),
    [
        (b'{"a": 1}\n\n  \t\n{"a": 2}\n', {1: 1, 4: 2}),  # blank lines skipped, still counted
        (b'{"a": 1}\r\n\r\n{"a": 2}\r\n', {1: 1, 3: 2}),  # CRLF
        (b'{"a": 1}\n{"a": 2}', {1: 1, 2: 2}),  # no newline at the end
        (BOM + b'{"a": 1}\n', {1: 1}),  # a BOM is not part of the first row
        ('{"a": "x\u2028y\x85z"}\n{"a": 2}\n'.encode(), {1: "x\u2028y\x85z", 2: 2}),
        ('\u2028\n{"a": 2}\n'.encode(), {2: 2}),  # a line of U+2028 alone is blank, as before
    ],
)
def test_jsonl_rows_and_their_lines(tmp_path, data, rows):
    f = tmp_path / "d.jsonl"
    f.write_bytes(data)
    got = read_table(f)
    assert [(r.where, r.data["a"]) for r in got] == [(f"{f}:{n}", a) for n, a in rows.items()]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b'{"a": 1}\n\n{"a": \n', "3: not valid JSON (Expecting value)"),
        # the "\n" is not part of the line: an unterminated string, not a control character
        (b'{"a": "x\n{"a": 2}\n', "1: not valid JSON (Unterminated string starting at)"),
        (b'{"a": 1}\r{"a": 2}\n', "1: not valid JSON (Extra data)"),  # "\r" alone ends no line
        (b'{"a": 1}\n[1]', "2: expected a JSON object (one row per line)"),
        # the byte is counted after the BOM, as the whole-text reading counted it
        (BOM + b'{"a": 1}\n{"a": "\xff"}\n', " not UTF-8 text (invalid start byte at byte 16)"),
        (b'{}\n{"a": "\xe2\x80"}\n', " not UTF-8 text (invalid continuation byte at byte 10)"),
    ],
)
def test_jsonl_errors_name_the_line_or_byte(tmp_path, data, error):
    f = tmp_path / "d.jsonl"
    f.write_bytes(data)
    with pytest.raises(TaskError) as e:
        read_table(f)
    assert str(e.value) == f"{f}:{error}"


@pytest.mark.parametrize(("suffix", "bound"), [(".jsonl", 1.5), (".json", 2.0)])
def test_reading_json_lines_holds_little_beside_the_rows(tmp_path, suffix, bound):
    """Peak traced memory over what the rows hold, for 5 MB of JSON lines of long strings.
    Before, a .jsonl file's lines (a second copy) were held beside the rows as they were
    built: 1.85 x; now 1.0 x. JSON lines under a .json name are first read whole as one JSON
    text (2 copies: bytes and text), which was held beside the rows too: 2.7 x; now 1.7 x."""
    f = tmp_path / f"d{suffix}"
    f.write_text("".join(json.dumps({"id": i, "a": "x" * 2500}) + "\n" for i in range(2000)))
    gc.collect()
    tracemalloc.start()
    try:
        rows = read_table(f)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(rows) == 2000 and held > f.stat().st_size  # the rows are what is held
    assert peak < bound * held, f"peak {peak / held:.2f} x the rows"
