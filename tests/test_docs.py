"""README.md and docs/*.md against the code, so that they cannot drift from it unseen: every
setting they name or set exists, every `slipstream ...` and `python bench/....py ...` command
they show parses as written (flags, choices, config overrides; nothing is run), and every
relative link, heading anchor and repository path they point to resolves."""

from __future__ import annotations

import argparse
import importlib
import re
import runpy
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest

from slipstream.config import Config, ConfigError, _all_keys, load_config, parse_value

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
KEYS = frozenset(_all_keys(Config))
SECTIONS = sorted({k.split(".")[0] for k in KEYS})

NOT_SETTINGS = frozenset({"trainer.learning_rate", "trainer.lrr"})
"""Names the docs give on purpose as wrong: the error a TRL name or a typo gets."""
ATTRIBUTES = frozenset({"engine.version"})
"""Dotted names that are an object's attribute, not a setting (docs/design.md: `Engine.version`)."""
FILE_SUFFIXES = ("py", "toml", "yaml", "json", "jsonl", "txt", "pt", "safetensors", "parquet")

_OVERRIDE = re.compile(rf"(?<![\w./-])((?:{'|'.join(SECTIONS)})\.[a-z_]+(?:\.[a-z_]+)?)=")
_DOTTED = re.compile(rf"(?:{'|'.join(SECTIONS)})(?:\.[A-Za-z_]\w*)+")
_COMMAND = re.compile(
    r"slipstream (?:train|sim|plan|report|replay|bench)\b|python3? bench/\w+\.py\b"
)
_PRINTED = re.compile(r"slipstream(?: [a-z]+)*: ")  # a line it prints: `slipstream train: error:`
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_REPO_PATH = re.compile(r"(?<![\w/.$-])((?:bench|tests|docs|src)/[\w./*-]*[\w*/])")
_MODULE_PATH = re.compile(r"(?<![\w/.$-])((?:[a-z_]+/)+[a-z_]+\.py)\b")


# ---- reading the markdown ----------------------------------------------------------------


def snippets(text: str) -> Iterator[tuple[int, str]]:
    """(line, code) for each logical line of a fenced block (backslash continuations joined)
    and each inline code span (whitespace joined, as it may wrap), outside fences."""
    lines = text.split("\n")
    fence = False
    prose = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fence = not fence
            prose.append("")
        elif fence:
            start = i
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
                prose.append("")
            yield start + 1, line
            prose.append("")
        else:
            prose.append(line)
        i += 1
    body = "\n".join(prose)
    for m in re.finditer(r"`([^`]+)`", body):
        yield body.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split())


def commands(code: str) -> Iterator[list[str]]:
    """The slipstream and bench commands of one snippet, as argv lists: each `&&` / `;` part
    that starts with one (after `VAR=value` assignments), its `# comment` dropped. Parts with
    placeholders (`run.dir=...`, `$VAR`, `RUN_DIR`, a bare `S`) are left out, as are names in prose
    (`slipstream replay`, `slipstream train / replay / report`) and lines a command prints
    (`slipstream train: error: ...`): they are not runnable."""
    for part in re.split(r"&&|;|\|", code):
        part = part.strip().lstrip("(")
        part = re.sub(r"^(?:[A-Z_]+=\S+\s+)+", "", part)
        if not _COMMAND.match(part) or _PRINTED.match(part):
            continue
        try:
            argv = shlex.split(part, comments=True)
        except ValueError:
            continue
        if any(
            a.endswith("...") or "$" in a or a == "/" or re.fullmatch(r"[A-Z][A-Z0-9_]*(/\S*)?", a)
            for a in argv
        ):
            continue
        if argv[0] != "slipstream" or len(argv) > (3 if argv[1] == "bench" else 2):
            yield argv  # (a bare `slipstream replay` is the command's name, in prose)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces
    to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The heading anchors of a markdown text (a repeated heading gets -1, -2, as on GitHub)."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    fence = False
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"#{1,6}\s+(.+)", line)
        if m:
            s = slug(m.group(1))
            out.add(f"{s}-{seen[s]}" if s in seen else s)
            seen[s] = seen.get(s, 0) + 1
    return out


# ---- the checks, each returning what it found wrong ----------------------------------------


def unknown_overrides(text: str) -> list[str]:
    """`section.key=` anywhere in the code of `text` whose key is not a setting."""
    return [
        f"{line}: {key}"
        for line, code in snippets(text)
        for key in _OVERRIDE.findall(code)
        if key not in KEYS and key not in NOT_SETTINGS
    ]


def _resolves(name: str) -> bool:
    """`name` (`engine.sampling`, `schedule.episodes.run_episodes`) is a module or an
    attribute of one under `slipstream`."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(["slipstream", *parts[:i]]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def unknown_names(text: str) -> list[str]:
    """Code spans that are a bare dotted name in a settings section (`runtime.max_restarts`)
    and neither a setting, a file name, an object's attribute nor a slipstream module."""
    bad = []
    for line, code in snippets(text):
        if not _DOTTED.fullmatch(code) or code in KEYS or code in ATTRIBUTES:
            continue
        if code.rsplit(".", 1)[1] in FILE_SUFFIXES or code in NOT_SETTINGS:
            continue
        if not _resolves(code):
            bad.append(f"{line}: {code}")
    return bad


def broken_links(doc: Path, text: str) -> list[str]:
    """Relative links whose file is missing, or whose `#anchor` is no heading there."""
    bad = []
    for m in _LINK.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):
            continue
        path, _, frag = target.partition("#")
        file = doc.parent / path if path else doc
        if not file.exists() or (frag and frag not in anchors(file.read_text(encoding="utf-8"))):
            bad.append(f"{text.count(chr(10), 0, m.start()) + 1}: {target}")
    return bad


def missing_paths(text: str) -> list[str]:
    """Repository paths (`bench/results/...`, `tests/data/...`) and module paths
    (`schedule/record.py`, under src/slipstream) that do not exist."""
    bad = []
    for n, line in enumerate(text.split("\n"), 1):
        for p in _REPO_PATH.findall(line):
            if not (list(ROOT.glob(p)) if "*" in p else (ROOT / p).exists()):
                bad.append(f"{n}: {p}")
        for p in _MODULE_PATH.findall(line):
            if not any((base / p).exists() for base in (ROOT, ROOT / "src" / "slipstream")):
                bad.append(f"{n}: {p}")
    return bad


NO_LITERAL = object()
"""What `_literal` gives for a phrase: no default stated."""


def _default(key: str) -> object:
    """The setting's default in the code (a built-in task run's: no `model.path`)."""
    value: Any = Config()
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _choices(key: str) -> tuple[object, ...]:
    """The values a `Literal` setting takes; () for any other."""
    section, name = key.split(".")
    model = type(getattr(Config(), section))
    annotation = model.model_fields[name].annotation
    return get_args(annotation) if get_origin(annotation) is Literal else ()


def _literal(text: str) -> object:
    """A default as the docs write it: `none`, a number (a unit after it: `10 s`), `true`, a
    pair `0.9, 0.99`, a word; what is not one (a phrase) is NO_LITERAL."""
    text = text.strip().strip("`")
    text = re.sub(r"(?<=\d) ?(s|%)$", "", text)
    if text == "none":
        return None
    if re.fullmatch(r"[-\d.e]+(, [-\d.e]+)+", text):
        text = f"[{text}]"
    value = parse_value(text)
    if isinstance(value, str) and not re.fullmatch(r"[a-z_]+", value):
        return NO_LITERAL
    return value


def _same(doc: object, code: object) -> bool:
    """A stated default equals the code's (30 is 30.0, a pair is a tuple; true is no 1)."""
    if isinstance(code, tuple):
        code = list(code)
    if isinstance(doc, int | float) and not isinstance(doc, bool) and not isinstance(code, bool):
        return isinstance(code, int | float) and float(doc) == float(code)
    return doc == code


def wrong_defaults(text: str) -> list[str]:
    """Defaults the docs state that are not the code's: the `default` column of a `| key |
    default |` table, and `` `section.key` (value) `` in prose (a word in the brackets counts
    only where it is one of the setting's choices, else it is no default: `(cosine)` is,
    `(its batching gives the queue its form)` is not)."""
    bad = []
    in_table = False  # inside a table whose first two columns are `key` and `default`
    for n, line in enumerate(text.split("\n"), 1):
        cells = (
            [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        )
        if cells[:2] == ["key", "default"] or not cells:
            in_table = bool(cells)
        elif in_table and cells[0].strip("`") in KEYS:
            key, doc = cells[0].strip("`"), _literal(cells[1])
            if doc is NO_LITERAL or not _same(doc, _default(key)):
                bad.append(f"{n}: {key} = {cells[1]!r}, code {_default(key)!r}")
        for m in re.finditer(r"`([a-z_]+\.[a-z_]+)` \(([^()]+)\)", line):
            key, doc = m.group(1), _literal(m.group(2))
            if key not in KEYS or doc is NO_LITERAL:
                continue
            if isinstance(doc, str) and doc not in _choices(key):
                continue
            if not _same(doc, _default(key)):
                bad.append(f"{n}: {key} ({m.group(2)}), code {_default(key)!r}")
    return bad


# ---- parsing a command without running it ------------------------------------------------


class _Parsed(BaseException):
    """Raised in place of argparse's result: the command got past its parser."""

    def __init__(self, namespace: argparse.Namespace, extra: list[str]) -> None:
        super().__init__()
        self.namespace, self.extra = namespace, extra


@pytest.fixture
def stop_at_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ArgumentParser raises `_Parsed` with its result instead of returning it."""
    parse_args = argparse.ArgumentParser.parse_args
    parse_known = argparse.ArgumentParser.parse_known_args
    inside = [False]  # parse_args calls parse_known_args: that one must return

    def args_then_stop(self: argparse.ArgumentParser, *a: Any, **kw: Any) -> Any:
        inside[0] = True
        try:
            ns = parse_args(self, *a, **kw)
        finally:
            inside[0] = False
        raise _Parsed(ns, [])

    def known_then_stop(self: argparse.ArgumentParser, *a: Any, **kw: Any) -> Any:
        if inside[0]:
            return parse_known(self, *a, **kw)
        ns, extra = parse_known(self, *a, **kw)
        raise _Parsed(ns, extra)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", args_then_stop)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", known_then_stop)


def parse_command(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str | None:
    """Parse a documented command as its own entry point does, and load its config overrides;
    None if it parses, else why not. Needs `stop_at_parse`."""
    try:
        if argv[0] == "slipstream":
            from slipstream.cli import main

            main(argv[1:])
        else:
            script = ROOT / argv[1]
            if "ArgumentParser" not in script.read_text(encoding="utf-8"):
                return None  # positional arguments read by hand: nothing to check here
            monkeypatch.setattr(sys, "argv", [str(script), *argv[2:]])
            monkeypatch.syspath_prepend(str(script.parent))
            runpy.run_path(str(script), run_name="__main__")
    except _Parsed as p:
        return _check_parsed(argv, p.namespace, p.extra)
    except (SystemExit, ConfigError) as e:
        return f"did not parse: {e}"
    return "did not parse (returned without reaching a parser's result)"


def _check_parsed(argv: list[str], ns: argparse.Namespace, extra: list[str]) -> str | None:
    unparsed = [a for a in extra if "=" not in a]
    if unparsed:
        return f"unknown arguments {unparsed}"
    # `--schedule-set pipeline:schedule.max_lag=2` (bench/agentic.py): an override of one
    # schedule's runs, checked below on that schedule
    ones: list[str] = getattr(ns, "schedule_set", None) or []
    lists = [v for k, v in vars(ns).items() if isinstance(v, list) and k != "schedule_set"]
    items = [*extra, *(x for v in lists for x in v)]
    overrides = [x for x in items if isinstance(x, str) and "=" in x and not x.startswith("-")]
    path = getattr(ns, "config", None)
    if argv[:2] == ["slipstream", "train"] and overrides != items and not path:
        path = next(x for x in items if "=" not in x)  # `slipstream train run.toml ...`
    wrong = [o for o in overrides if o.partition("=")[0] in NOT_SETTINGS]
    try:
        load_config(path, [o for o in overrides if o not in wrong])
    except ConfigError as e:
        return f"config: {e}"
    for sched, _, override in (x.partition(":") for x in ones):
        try:
            load_config(path, [*overrides, f'schedule.name="{sched}"', override])
        except ConfigError as e:
            return f"config ({sched}'s runs): {e}"
    for o in wrong:  # shown as the error it gets: it must get one
        with pytest.raises(ConfigError, match="unknown key"):
            load_config(None, [o])
    return None


def documented_commands() -> list[tuple[str, list[str]]]:
    return [
        (f"{doc.relative_to(ROOT)}:{line}", argv)
        for doc in DOCS
        for line, code in snippets(doc.read_text(encoding="utf-8"))
        for argv in commands(code)
    ]


def _readme_toml(name: str) -> str:
    """The README's example config file that opens with `# NAME`."""
    readme = DOCS[0].read_text(encoding="utf-8")
    return readme.split(f"# {name}\n", 1)[1].split("```", 1)[0]


# ---- the tests ---------------------------------------------------------------------------


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_setting_the_docs_set_exists(doc: Path) -> None:
    assert unknown_overrides(doc.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_dotted_name_the_docs_show_is_a_setting_or_a_module(doc: Path) -> None:
    assert unknown_names(doc.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_relative_links_and_anchors_resolve(doc: Path) -> None:
    assert broken_links(doc, doc.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_repository_paths_the_docs_name_exist(doc: Path) -> None:
    assert missing_paths(doc.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_the_defaults_the_docs_state_are_the_codes(doc: Path) -> None:
    assert wrong_defaults(doc.read_text(encoding="utf-8")) == []


def test_the_names_shown_as_wrong_are_refused_with_a_hint() -> None:
    for key in NOT_SETTINGS:
        with pytest.raises(ConfigError, match=f"unknown key '{key}' \\(did you mean"):
            load_config(None, [f"{key}=1"])


def test_the_readme_example_config_file_loads(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(_readme_toml("run.toml"))
    cfg = load_config(tmp_path / "run.toml")
    assert (cfg.trainer.loss, cfg.trainer.advantage, cfg.run.seed) == ("dapo", "rloo", 1)


def test_every_documented_command_parses(
    stop_at_parse: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # where `slipstream train run.toml ...` finds its file
    (tmp_path / "run.toml").write_text(_readme_toml("run.toml"))
    found = documented_commands()
    scripts = {argv[1] for _, argv in found if argv[0] != "slipstream"}
    assert len(found) >= 70 and {"bench/agentic.py", "bench/engine.py"} <= scripts
    failures = [
        f"{where}: {shlex.join(argv)}: {why}"
        for where, argv in found
        if (why := parse_command(argv, monkeypatch)) is not None
    ]
    assert failures == []


# ---- the checks can fail (consistency checks of the checkers on made-up docs) ------------


def test_the_checks_report_a_renamed_setting_a_dead_anchor_and_a_missing_path() -> None:
    text = (
        "Run `slipstream train trainer.lrr=1 trainer.lr=1`, read `runtime.max_restart`\n"
        "and `engine.sampling`, see [x](README.md#no-such-heading) and "
        "[y](README.md#quick-start-cpu-a-fresh-machine),\n"
        "bench/results/no_such_file.txt, `schedule/no_such.py` and `schedule/record.py`.\n"
    )
    doc = ROOT / "README.md"
    assert unknown_overrides(text.replace("lrr", "lrx")) == ["1: trainer.lrx"]
    assert unknown_names(text) == ["1: runtime.max_restart"]
    assert broken_links(doc, text) == ["2: README.md#no-such-heading"]
    assert missing_paths(text) == ["3: bench/results/no_such_file.txt", "3: schedule/no_such.py"]


def test_the_defaults_check_reads_tables_and_brackets() -> None:
    text = (
        "| key | default | what |\n| --- | --- | --- |\n"
        "| `env.workers` | 9 | workers |\n| `env.tools` | none | a class |\n"
        "| `env.step_timeout_s` | 30 | seconds |\n\n"
        "`trainer.lr_schedule` (constant), `trainer.warmup_steps` (10), `trainer.betas` (0.9, "
        "0.999), `runtime.call_timeout_s` (60 s), `schedule.name` (its batching), "
        "`trainer.proximal` (recompute)\n"
    )
    assert wrong_defaults(text) == [
        "3: env.workers = '9', code 8",
        "7: trainer.lr_schedule (constant), code 'cosine'",
        "7: trainer.betas (0.9, 0.999), code (0.9, 0.99)",
        "7: trainer.proximal (recompute), code 'auto'",
    ]


def test_a_command_with_a_wrong_flag_or_choice_does_not_parse(
    stop_at_parse: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ok = ["python", "bench/engine.py", "--part", "sampling", "--device", "cpu"]
    assert parse_command(ok, monkeypatch) is None
    assert parse_command([*ok[:-2], "--devices", "cpu"], monkeypatch) is not None
    assert parse_command(["python", "bench/engine.py", "--part", "all2"], monkeypatch) is not None
    assert parse_command(["slipstream", "sim", "--max-lags", "4"], monkeypatch) is not None
    assert "config" in str(parse_command(["slipstream", "train", "run.stepz=2"], monkeypatch))
    beyond = ["python", "bench/beyond.py", "--skip-auto", "--skip-forecast"]
    assert "unknown arguments" in str(parse_command([*beyond, "--skip-watchdgo"], monkeypatch))


def test_commands_are_read_from_fences_and_code_spans() -> None:
    text = (
        "```bash\nslipstream train run.steps=3 \\\n    trainer.lr=1e-3   # a comment\n"
        "pip install x && python bench/engine.py --quick\n```\n"
        "and `OMP_WAIT_POLICY=ACTIVE slipstream train ...`, `slipstream replay RUN_DIR`, `slipstream\n"
        "plan --gpus 8`.\n```\nslipstream bench schedules: error: --seeds: expected integers, got 'a'\n```\n"
    )
    found = [argv for _, code in snippets(text) for argv in commands(code)]
    assert found == [
        ["slipstream", "train", "run.steps=3", "trainer.lr=1e-3"],
        ["python", "bench/engine.py", "--quick"],
        ["slipstream", "plan", "--gpus", "8"],
    ]
    assert slug("Schedules: sync, tail batching, `async`") == "schedules-sync-tail-batching-async"
    assert anchors("# A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1"}


def test_a_one_schedule_override_is_checked_on_that_schedule() -> None:
    argv = ["python", "bench/agentic.py"]
    ok = argparse.Namespace(schedule_set=["pipeline:schedule.max_lag=2"])
    assert _check_parsed(argv, ok, []) is None
    for bad in ("sync:schedule.max_lag=2", "pipeline:schedule.max_lagg=2"):
        why = _check_parsed(argv, argparse.Namespace(schedule_set=[bad]), [])
        assert why is not None and why.startswith("config (")
