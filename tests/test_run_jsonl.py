"""The JSONL files a run appends to (metrics.jsonl, timeline.jsonl) read back by one reader,
`files.read_run_jsonl`: a torn last line (no newline after it) is left out and reported,
lines end at "\\n" only, and a bad line elsewhere comes back for the caller to refuse or skip.
Then each reader of run files on the same damaged or odd file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slipstream.files import JsonLine, read_run_jsonl
from slipstream.observe.runs import ReportError, read_metrics
from slipstream.observe.timeline import Interval, read_timeline
from slipstream.run.resume import rewind, truncate_metrics
from slipstream.run.summary import read_records
from slipstream.sim.runs import RunError
from slipstream.sim.runs import read_metrics as sim_read_metrics
from slipstream.text import read_lines, read_text

ODD = "x\u2028y\x85z"  # legal unescaped in a JSON string; str.splitlines() ends a line at both


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(text.encode("utf-8"))
    return path


def test_a_torn_last_line_is_left_out_and_reported(tmp_path: Path) -> None:
    path = _write(tmp_path, '{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    lines, torn = read_run_jsonl(path, ValueError)
    assert torn and [line.value for line in lines] == [{"step": 1}, {"step": 2}]
    # cut where the record was still whole JSON: a record, not a torn line
    path = _write(tmp_path, '{"step": 1}\n{"step": 2}')
    lines, torn = read_run_jsonl(path, ValueError)
    assert not torn and [line.value for line in lines] == [{"step": 1}, {"step": 2}]


def test_a_bad_line_that_ended_with_its_newline_was_not_torn(tmp_path: Path) -> None:
    """The writer puts a line's newline last, so a line a kill cut short has none: a bad line
    followed by one (in the middle, or last) is damage, returned with its error."""
    for text in (
        '{"step": 1}\n{"st\n{"step": 3}\n',
        '{"step": 1}\n{"st\n',
        '{"step": 1}\n{"st\n\n',
    ):
        lines, torn = read_run_jsonl(_write(tmp_path, text), ValueError)
        assert not torn
        assert lines[1] == JsonLine(2, '{"st', None, "Unterminated string starting at"), text


def test_blank_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    path = _write(tmp_path, '\n{"step": 1}\n  \n\n{"step": 4}\n\n')
    lines, torn = read_run_jsonl(path, ValueError)
    assert not torn and [(line.n, line.value) for line in lines] == [
        (2, {"step": 1}),
        (5, {"step": 4}),
    ]
    assert read_run_jsonl(_write(tmp_path, ""), ValueError) == ([], False)


def test_lines_end_at_newline_only(tmp_path: Path) -> None:
    """U+2028 and U+0085 inside a string are part of the line (the sinks escape them; a file
    another tool wrote may not); the text comes back as written, for a resume to rewrite."""
    line = json.dumps({"step": 1, "text": ODD}, ensure_ascii=False)
    path = _write(tmp_path, line + '\n{"step": 2}\n')
    lines, torn = read_run_jsonl(path, ValueError)
    assert not torn
    assert lines == [
        JsonLine(1, line, {"step": 1, "text": ODD}),
        JsonLine(2, '{"step": 2}', {"step": 2}),
    ]


def test_a_file_that_is_not_utf8_or_missing_raises_the_callers_error(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n{"a": "\xff"}\n')
    with pytest.raises(
        RunError, match=r"metrics.jsonl: not UTF-8 text \(invalid start byte at byte 19\)"
    ):
        read_run_jsonl(path, RunError)
    with pytest.raises(ReportError, match=r"nope.jsonl: cannot be read"):
        read_run_jsonl(tmp_path / "nope.jsonl", ReportError)


@pytest.mark.parametrize("text", ["", "a", "a\n", "a\n\nb", "a\r\nb\n\n", "\ufeffa\nb", ODD + "\n"])
def test_read_lines_gives_the_lines_split_gives(tmp_path: Path, text: str) -> None:
    """A consistency check: the streaming reader and the whole text split at "\\n" agree, a
    last "" after a closing newline included (what tells a torn last line from a whole one)."""
    path = _write(tmp_path, text)
    assert list(read_lines(path, ValueError)) == read_text(path, ValueError).split("\n")


# ---- each reader of run files ----

GOOD = '{"step": 1, "wall_s": 1.0}\n'


def test_the_report_and_the_simulator_skip_a_torn_last_line_and_refuse_a_bad_one(
    tmp_path: Path,
) -> None:
    """Before, the report (and the timeline) skipped a bad last line even when its newline
    followed it, which no kill leaves (and only when no blank line followed), where the
    simulator refused the same file: damage went unseen. Now both refuse it."""
    path = _write(tmp_path, GOOD + '{"step": 2, "wa')
    assert read_metrics(path) == [json.loads(GOOD)]
    assert sim_read_metrics(path) == ([json.loads(GOOD)], True)
    path = _write(tmp_path, GOOD + '{"step": 2, "wa\n')
    with pytest.raises(ReportError, match=r"metrics.jsonl:2: not valid JSON"):
        read_metrics(path)
    with pytest.raises(RunError, match=r"metrics.jsonl:2: not valid JSON"):
        sim_read_metrics(path)


def test_the_timeline_refuses_a_bad_last_line_with_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "timeline.jsonl"
    whole = json.dumps({"actor": "a", "kind": "train", "t0": 0, "t1": 1}) + "\n"
    path.write_text(whole + '{"actor": "a", "ki')
    assert read_timeline(path) == [Interval("a", "train", 0.0, 1.0)]
    path.write_text(whole + '{"actor": "a", "ki\n')
    with pytest.raises(ValueError, match=r"timeline.jsonl:2: expected \{actor, kind, t0, t1\}"):
        read_timeline(path)


def test_every_reader_keeps_a_record_holding_u2028(tmp_path: Path) -> None:
    """Before, the report, the timeline, the end of a run and a resume split a line at U+2028
    (str.splitlines()): the report and timeline refused the file, and the run's own readers
    dropped the record, so a resume rewrote metrics.jsonl without it."""
    rec = {"step": 1, "wall_s": 1.0, "note": ODD}
    line = json.dumps(rec, ensure_ascii=False) + "\n"
    path = _write(tmp_path, line + GOOD.replace('"step": 1', '"step": 2'))
    assert read_metrics(path)[0] == rec
    assert read_records(path)[0] == rec
    truncate_metrics(path, 1)
    assert path.read_text(encoding="utf-8") == line
    timeline = tmp_path / "timeline.jsonl"
    interval = json.dumps({"actor": ODD, "kind": "train", "t0": 0, "t1": 1}, ensure_ascii=False)
    timeline.write_text(interval + "\n", encoding="utf-8")
    assert read_timeline(timeline) == [Interval(ODD, "train", 0.0, 1.0)]


def test_the_runs_own_readers_skip_every_bad_line(tmp_path: Path) -> None:
    """The end of a run and its resume read the run's own files, which a failing metrics sink
    (warned once, writes tried again) may have left a bad line in: they skip it rather than
    fail, as before; a resume drops it and the records after the checkpoint."""
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_000002"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(json.dumps({"wall_s": 2.0}))
    rows = [json.dumps({"step": s}) + "\n" for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text(rows[0] + '{"st\n\n' + rows[1] + "[1]\n" + rows[2] + '{"st')
    assert read_records(run / "metrics.jsonl") == [{"step": 1}, {"step": 2}, {"step": 3}]
    intervals = [
        json.dumps({"actor": "a", "kind": "train", "t0": t, "t1": t}) + "\n" for t in (1, 3)
    ]
    (run / "timeline.jsonl").write_text(
        intervals[0] + '{"t0": "x"}\n{"ac\n' + intervals[1] + '{"ac'
    )
    rewind(ckpt)
    assert (run / "metrics.jsonl").read_text() == rows[0] + rows[1] + "[1]\n"
    assert (run / "timeline.jsonl").read_text() == intervals[0]
