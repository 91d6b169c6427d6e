"""Fuzzing of what users type and write: every bad config or dataset is one clear error.

Configs: random dotted keys (valid, near-valid, garbage), random values and random TOML/YAML
files may fail only with a one-line `ConfigError` that names a key or the file. Datasets:
random JSONL files may fail only with a `TaskError` that names the file (and the line).
"""

from __future__ import annotations

import contextlib
import json
import string

import pytest
import tomli_w
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slipstream.config import Config, ConfigError, _all_keys, load_config, read_file
from slipstream.tasks.jsonl import TaskError
from slipstream.tasks.rows import read_rows

KEYS = _all_keys(Config)
SECTIONS = sorted({k.split(".")[0] for k in KEYS})
ODD = [
    "\u202e",
    "\x00",
    "\ufeff",
    "\u2028",
    "\n",
    "\r",
    "é",
    "日本",
    "\U0001f600",
    "\ud800",
    '"',
    "'",
    "=",
]

# ---- configs ------------------------------------------------------------------------------


def _mutate(key: str, data: st.DataObject) -> str:
    """A near-valid key: one character dropped, doubled or changed, or a segment added."""
    i = data.draw(st.integers(0, len(key) - 1))
    how = data.draw(st.sampled_from(["drop", "double", "change", "extra", "empty", "case"]))
    if how == "drop":
        return key[:i] + key[i + 1 :]
    if how == "double":
        return key[:i] + key[i] + key[i:]
    if how == "change":
        return (
            key[:i]
            + data.draw(st.sampled_from(string.ascii_lowercase + "._-" + "".join(ODD)))
            + key[i + 1 :]
        )
    if how == "extra":
        return key + "." + data.draw(st.sampled_from(["x", "", "steps", "0"]))
    if how == "empty":
        return key.replace(".", "..", 1) if "." in key else "." + key
    return key.upper()


_text = st.text(
    alphabet=st.characters(codec=None, exclude_categories=()), max_size=30
) | st.sampled_from(ODD)
_number = (
    st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0, 1, -1, 2**63, -(2**63), 10**400])
)
_literal = st.sampled_from(
    [
        "nan",
        "inf",
        "-inf",
        "+inf",
        "true",
        "false",
        "[]",
        "[1, 2]",
        '["jsonl"]',
        "{}",
        "{a = 1}",
        "1979-05-27",
        "0x10",
        "1_000",
        "1e999",
        '""',
        "''",
        "[[1]]",
        "[",
        '"',
        "1.",
        ".5",
    ]
)


@st.composite
def override(draw: st.DrawFn) -> str:
    data = draw(st.data())
    kind = draw(st.sampled_from(["valid", "near", "section", "garbage"]))
    if kind == "valid":
        key = draw(st.sampled_from(KEYS))
    elif kind == "near":
        key = _mutate(draw(st.sampled_from(KEYS)), data)
    elif kind == "section":
        key = draw(st.sampled_from(SECTIONS))
    else:
        key = draw(_text)
    value = draw(
        _literal
        | _number.map(repr)
        | _number.map(str)
        | st.booleans().map(str)
        | _text
        | _text.map(json.dumps)
        | st.lists(_number | st.booleans(), max_size=3).map(lambda v: json.dumps(v, default=str))
    )
    if draw(st.integers(0, 30)) == 0:
        return key  # no '='
    return f"{key}={value}"


def _dotted(tree: object, prefix: str = "") -> list[str]:
    if not isinstance(tree, dict):
        return []
    return [n for k, v in tree.items() for n in (f"{prefix}{k}", *_dotted(v, f"{prefix}{k}."))]


def _names_a_key_or_file(
    msg: str, overrides: list[str], path: str | None = None, tree: object = None
) -> bool:
    if path is not None and path in msg:
        return True
    given = {o.partition("=")[0].strip() for o in overrides} | set(_dotted(tree))
    if path is not None:  # keys as the file reads back (YAML reads a \x85 in a key as ' ')
        with contextlib.suppress(ConfigError):
            given |= set(_dotted(read_file(path)))
    prefixes = {".".join(k.split(".")[: i + 1]) for k in given for i in range(len(k.split(".")))}
    names = {*KEYS, *SECTIONS, *given, *prefixes}
    return any(k in msg or repr(k) in msg for k in names if k) or "key=value" in msg


def _check(overrides: list[str], path: str | None = None, tree: object = None) -> None:
    try:
        load_config(path, overrides)
    except ConfigError as e:
        msg = str(e)
        assert "\n" not in msg and "\r" not in msg, repr(msg)
        assert _names_a_key_or_file(msg, overrides, path, tree), repr(msg)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(override(), min_size=1, max_size=4))
def test_fuzzed_overrides_fail_only_with_one_line_config_error(overrides):
    _check(overrides)


_scalar = _number | st.booleans() | _text
_section = st.dictionaries(
    st.sampled_from([k.split(".")[-1] for k in KEYS]) | _text,
    _scalar | st.lists(_scalar, max_size=3),
    max_size=4,
)
_tree = st.dictionaries(st.sampled_from(SECTIONS) | _text, _section | _scalar, max_size=4)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@example(tree={"\x85": {}}, fmt="yaml", garble=b"", cut=1)  # the key reads back as ' '
@given(
    tree=_tree,
    fmt=st.sampled_from(["toml", "yaml", "yml"]),
    garble=st.binary(max_size=20),
    cut=st.integers(0, 200),
)
def test_fuzzed_config_files_fail_only_with_config_error(tmp_path, tree, fmt, garble, cut):
    path = tmp_path / f"c.{fmt}"
    try:
        text = tomli_w.dumps(tree) if fmt == "toml" else yaml.safe_dump(tree, allow_unicode=True)
        data = text.encode("utf-8", "surrogatepass")
    except (ValueError, TypeError, yaml.YAMLError):
        data = repr(tree).encode("utf-8", "surrogatepass")
    if cut % 3 == 0:  # a damaged file: cut short, with bytes that may not be UTF-8
        data = data[:cut] + garble
    path.write_bytes(data)
    _check([], str(path), tree)


@pytest.mark.parametrize(
    "text",
    [
        "[run]\nsteps = " + "[" * 5000 + "]" * 5000,
        "run: " + "[" * 5000 + "]" * 5000,
        "\ufeff[run]\nsteps = 2\n",
    ],
)
@pytest.mark.parametrize("fmt", ["toml", "yaml"])
def test_deep_or_odd_config_files_are_config_errors(tmp_path, text, fmt):
    path = tmp_path / f"c.{fmt}"
    path.write_text(text, encoding="utf-8")
    _check([], str(path))


def test_config_file_that_is_a_folder_or_binary(tmp_path):
    _check([], str(tmp_path))
    (tmp_path / "b.toml").write_bytes(b"\xff\xfe[run]\x00")
    _check([], str(tmp_path / "b.toml"))


# ---- JSONL datasets ---------------------------------------------------------------------

_json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
_good_row = st.fixed_dictionaries(
    {"prompt": st.text(min_size=1, max_size=20), "answer": st.text(max_size=5) | st.integers()}
)
_row = _good_row | st.dictionaries(
    st.sampled_from(["prompt", "answer", "id"]) | st.text(max_size=5), _json_value, max_size=4
)


@st.composite
def jsonl_line(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["good", "row", "value", "bad", "odd", "bytes", "blank"]))
    if kind == "good":
        return json.dumps(draw(_good_row), ensure_ascii=draw(st.booleans())).encode(
            "utf-8", "surrogatepass"
        )
    if kind == "row":
        return json.dumps(draw(_row), ensure_ascii=draw(st.booleans())).encode(
            "utf-8", "surrogatepass"
        )
    if kind == "value":
        return json.dumps(draw(_json_value)).encode()
    if kind == "bad":
        return draw(
            st.sampled_from(
                [
                    b"{",
                    b'{"prompt": "a", "answer": }',
                    b"NaN",
                    b"[" * 20000,
                    b"1" * 5000,
                    b'{"prompt": "a", "answer": ' + b"9" * 5000 + b"}",
                    b"\x00",
                    b"{'prompt': 1}",
                ]
            )
        )
    if kind == "odd":
        odd = draw(st.sampled_from([*ODD, "\u2029", "\x85", "\x0c"]))
        return ('{"prompt": "a' + odd + 'b", "answer": "1"}').encode("utf-8", "surrogatepass")
    if kind == "bytes":
        return draw(st.binary(max_size=20))
    return draw(st.sampled_from([b"", b"   ", b"\r"]))


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=st.lists(jsonl_line(), max_size=6), bom=st.booleans(), crlf=st.booleans())
def test_fuzzed_jsonl_fails_only_with_task_error_naming_file_and_line(tmp_path, lines, bom, crlf):
    path = tmp_path / "d.jsonl"
    data = (b"\r\n" if crlf else b"\n").join(lines)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
    try:
        rows = read_rows(path)
    except TaskError as e:
        msg = str(e)
        assert msg.startswith(f"{path}:"), msg
        assert "\n" not in msg, repr(msg)
    else:
        assert rows and all(
            isinstance(p.text, str) and p.text and isinstance(p.answer, str) for p in rows
        )
        for p in rows:
            (p.text + p.answer).encode("utf-8")  # a tokenizer can take it: no lone surrogates


def test_jsonl_line_numbers_count_newlines_only(tmp_path):
    """U+2028 and friends are legal inside a JSON string: they must not split a line."""
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"prompt": "a\u2028b\x85c", "answer": "1"}\n{"prompt": "x"}\n', encoding="utf-8"
    )
    with pytest.raises(TaskError, match=r"d\.jsonl:2: missing column 'answer'"):
        read_rows(path)


def test_jsonl_bom_huge_line_and_huge_number(tmp_path):
    path = tmp_path / "d.jsonl"
    big = "x" * 2**20
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"prompt": big, "answer": 3}).encode() + b"\n")
    assert read_rows(path)[0].text == big  # a BOM is not part of the first row
    path.write_text('{"prompt": "a", "answer": ' + "9" * 5000 + "}\n")
    with pytest.raises(TaskError, match=r"d\.jsonl:1: "):
        read_rows(path)
    path.write_text("")
    with pytest.raises(TaskError, match=r"d\.jsonl: no rows"):
        read_rows(path)
