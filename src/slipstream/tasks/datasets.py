"""Dataset files as users have them: JSONL, JSON, Parquet, CSV, a folder of them, or a hub id.

`read_table(path, split)` gives the rows of a file or folder, each with where it came from
(`train.jsonl:17`, `train.parquet: row 5`), so a bad row is named in one line. JSON and JSONL
are read here, line-exact (JSONL a line at a time) and without any optional package; Parquet,
CSV and Arrow files and hub dataset ids go through the `datasets` library
(`pip install 'slipstream[data]'`).

A folder holds files of one or several splits (a `save_to_disk` folder of `datasets` too, its
metadata JSON files left out): files whose path names the split (`train.jsonl`,
`test/part0.csv`) are that split's, and a hub shard `data/{split}-00000-of-00001.parquet` is
exactly split `{split}`'s (`train_sft`'s shards are not `train`'s), as `datasets` reads them;
with no file naming any split, every file is the `train` split. A hub dataset downloaded as a
folder keeps each config in a folder of its name (openai/gsm8k: `main/`, `socratic/`):
`task.dataset_config` picks it, and a split whose files lie in several such folders without
it is an error (their rows would be mixed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from slipstream.files import jsonl_lines
from slipstream.tasks.jsonl import TaskError
from slipstream.text import first_line, read_lines, read_text

JSON_SUFFIXES = (".jsonl", ".json")
ARROW_SUFFIXES = {".parquet": "parquet", ".csv": "csv", ".tsv": "csv", ".arrow": "arrow"}
SUFFIXES = (*JSON_SUFFIXES, *ARROW_SUFFIXES)
SPLIT_NAMES = ("train", "test", "validation", "valid", "dev", "eval")
# what `datasets`' save_to_disk writes beside its .arrow shards: metadata, not rows
SAVE_TO_DISK_META = ("dataset_info.json", "state.json", "dataset_dict.json")
SHARD = re.compile(r"(.+?)-[0-9]{5}-of-[0-9]{5}[^/]*\.[^/]+")  # {split}-00000-of-00001.ext
INSTALL = "pip install 'slipstream[data]'"


@dataclass(frozen=True)
class Row:
    """One record of a dataset and where it is, for messages (`file:line` or `file: row N`)."""

    where: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Split:
    """Which rows of a folder or hub dataset to read: the split's name, the setting that named
    it (for messages), the split a folder whose files name none is taken to be (`train` for
    training data; an evaluation set's own split for `eval.sets`), and a hub dataset's config
    name (`load_dataset(path, name)`, TRL's `dataset_config`)."""

    name: str = "train"
    setting: str = "task.split"
    unnamed: str = "train"
    config: str | None = None


def read_table(path: str | Path, split: str | Split = "train") -> list[Row]:
    """Every row of `path` (a file, a folder of files, or a hub dataset id) for `split`."""
    sp = split if isinstance(split, Split) else Split(split)
    p = Path(path)
    if p.is_dir():
        return [row for f in split_files(p, sp) for row in read_file(f)]
    if p.is_file():
        return read_file(p)
    if looks_like_hub_id(str(path)):
        return read_hub(str(path), sp.name, sp.config)
    raise TaskError(f"{path}: no such file or folder")


def split_files(folder: Path, split: str | Split) -> list[Path]:
    """The data files of `folder` that belong to `split` (module docstring), sorted."""
    sp = split if isinstance(split, Split) else Split(split)
    files = sorted(f for f in folder.rglob("*") if f.is_file() and f.suffix in SUFFIXES)
    files = [f for f in files if not any(p.startswith(".") for p in f.relative_to(folder).parts)]
    if any(f.suffix == ".arrow" for f in files):  # a save_to_disk folder (load_from_disk's)
        files = [f for f in files if f.name not in SAVE_TO_DISK_META]
    if not files:
        raise TaskError(f"{folder}: no {', '.join(SUFFIXES)} files in this folder")
    if sp.config is not None:
        files = config_files(folder, files, sp.config)

    def names(f: Path) -> set[str]:
        return file_splits(f.relative_to(folder))

    named = [f for f in files if sp.name in names(f)]
    named_any = any(names(f) & set(SPLIT_NAMES) or shard_split(f.name) for f in files)
    if not named and sp.name == sp.unnamed and not named_any:
        named = files
    if named:
        configs = sorted(folders(folder, named) - set(SPLIT_NAMES)) if sp.config is None else []
        if len(configs) > 1:
            raise TaskError(
                f"{folder}: the {sp.name!r} files lie in several folders ({', '.join(configs)}), "
                "as a hub dataset's configs do: name one with task.dataset_config"
            )
        return named
    found = sorted({w for f in files for w in names(f) & {*SPLIT_NAMES, shard_split(f.name)}})
    raise TaskError(
        f"{folder}: no file of split {sp.name!r} ({sp.setting}); splits here: "
        f"{', '.join(found) or f'none (all of it is {sp.unnamed})'}"
    )


def shard_split(name: str) -> str:
    """The split a hub shard's file name gives, `{split}-00000-of-00001.*` (the hub's
    `data/train_sft-00000-of-00001.parquet` is split `train_sft`, as `datasets` reads it, not
    `train`); "" for any other name, and for save_to_disk's own `data-00000-of-00001.arrow`,
    whose split is its folder's."""
    m = SHARD.fullmatch(name)
    return m.group(1).lower() if m and m.group(1) != "data" else ""


def file_splits(rel: Path) -> set[str]:
    """The split names a data file's path (relative to its folder) carries: every word of its
    folders, and of its name (`train.jsonl`, `part_test_0.csv`), or a hub shard's one split."""
    words = {w for part in rel.parts[:-1] for w in re.split(r"[-_.]", part.lower())}
    shard = shard_split(rel.name)
    return words | ({shard} if shard else set(re.split(r"[-_.]", rel.stem.lower())))


def folders(folder: Path, files: list[Path]) -> set[str]:
    """The first-level folders of `folder` that hold some of `files`."""
    return {f.relative_to(folder).parts[0] for f in files if len(f.relative_to(folder).parts) > 1}


def config_files(folder: Path, files: list[Path], config: str) -> list[Path]:
    """The files of `folder`'s config `config`: those in its folder of that name."""
    mine = [f for f in files if f.relative_to(folder).parts[0] == config]
    if not mine:
        here = ", ".join(sorted(folders(folder, files))) or "none"
        raise TaskError(
            f"{folder}: no folder {config!r} of data files (task.dataset_config); folders: {here}"
        )
    return mine


def read_file(path: Path) -> list[Row]:
    if path.suffix == ".jsonl":
        return read_jsonl(path)
    if path.suffix == ".json":
        return read_json(path)
    if path.suffix in ARROW_SUFFIXES:
        return read_arrow(path)
    raise TaskError(
        f"{path}: unknown dataset file type {path.suffix!r}; expected {', '.join(SUFFIXES)}"
    )


def _json_error(path: Path, n: int | None, e: Exception) -> TaskError:
    where = f"{path}:{n}" if n is not None else str(path)
    if isinstance(e, json.JSONDecodeError):
        return TaskError(f"{where}: not valid JSON ({e.msg})")
    # an integer over 4300 digits (ValueError), or deep nesting (RecursionError)
    msg = "nested too deeply" if isinstance(e, RecursionError) else str(e).splitlines()[0]
    return TaskError(f"{where}: not valid JSON ({msg})")


def read_jsonl(path: Path) -> list[Row]:
    """One JSON object per line; a bad line raises `TaskError` naming `file:line`. The file is
    read a line at a time (`read_lines`: lines end at "\n" only), so that a large dataset's
    peak memory is its rows, not its text too."""
    rows = []
    for n, line in jsonl_lines(read_lines(path, TaskError)):
        try:
            data = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise _json_error(path, n, e) from None
        if not isinstance(data, dict):
            raise TaskError(f"{path}:{n}: expected a JSON object (one row per line)")
        rows.append(Row(f"{path}:{n}", data))
    return rows


def read_json(path: Path) -> list[Row]:
    """A JSON array of objects (or `{"data": [...]}`); a file of JSON lines is read as JSONL."""
    text = read_text(path, TaskError)
    lines = False
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        # JSON lines under a .json name, as `datasets` accepts: a first value on one line, then
        # more; any other error (a pretty-printed array's stray comma) is named at its own line
        if e.msg != "Extra data" or "\n" in text[: e.pos].strip():
            raise _json_error(path, e.lineno, e) from None
        lines = True  # read outside this block: the error being handled holds the text
    except (ValueError, RecursionError) as e:
        raise _json_error(path, None, e) from None
    del text  # not held beside the rows
    if lines:
        return read_jsonl(path)
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if isinstance(data, dict):
        return [Row(f"{path}: row 0", data)]
    if not isinstance(data, list):
        raise TaskError(f"{path}: expected a JSON array of objects")
    rows = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise TaskError(f"{path}: row {i}: expected a JSON object")
        rows.append(Row(f"{path}: row {i}", item))
    return rows


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise TaskError(
            f"reading Parquet, CSV, Arrow or hub datasets needs the datasets library: {INSTALL}"
        ) from None
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def read_arrow(path: Path) -> list[Row]:
    """A Parquet, CSV/TSV or Arrow file through `datasets`; rows named by index (`ds[N]`)."""
    ds = _datasets()
    kind = ARROW_SUFFIXES[path.suffix]
    try:
        if kind == "parquet":
            table = ds.Dataset.from_parquet(str(path), keep_in_memory=True)
        elif kind == "csv":
            sep = "\t" if path.suffix == ".tsv" else ","
            table = ds.Dataset.from_csv(str(path), keep_in_memory=True, sep=sep)
        else:
            table = ds.Dataset.from_file(str(path), in_memory=True)
    except Exception as e:  # pyarrow's and pandas' errors: one line, naming the file
        raise TaskError(f"{path}: cannot be read as {kind} ({first_line(e)})") from None
    return [Row(f"{path}: row {i}", r) for i, r in enumerate(table_rows(table))]


class Batches(Protocol):
    """What `table_rows` reads of a `datasets.Dataset` (an optional, untyped dependency)."""

    def iter(self, batch_size: int) -> Iterator[dict[str, list[Any]]]: ...


def table_rows(table: Batches, batch: int = 1000) -> Iterator[dict[str, Any]]:
    """The rows of a `datasets.Dataset`, as its own iteration gives them, formatted `batch` at
    a time: its row by row iteration formats a one-row Arrow slice per row (60 us a row, 10
    minutes for 10M rows; 8 us a row this way)."""
    for columns in table.iter(batch_size=batch):
        yield from (dict(zip(columns, values)) for values in zip(*columns.values()))


def looks_like_hub_id(path: str) -> bool:
    """`owner/name`, not a data file's name: what `read_table` asks the hub for."""
    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+", path)) and Path(path).suffix not in SUFFIXES


def read_hub(name: str, split: str, config: str | None = None) -> list[Row]:
    """A dataset from the Hugging Face hub (`owner/name`, with its `config` name where it has
    several: `openai/gsm8k`'s `main`), where the network allows it."""
    ds = _datasets()
    which = f"split {split!r}" + (f", config {config!r}" if config else "")
    try:
        table = ds.load_dataset(name, config, split=split)
    except Exception as e:  # offline, a missing dataset, config or split: say which, in one line
        hint = " (name one with task.dataset_config)" if "config" in str(e).lower() else ""
        raise TaskError(
            f"{name}: no such local file or folder, and the hub dataset could not be loaded "
            f"({which}): {first_line(e)}{hint}"
        ) from None
    return [Row(f"{name} ({split}): row {i}", r) for i, r in enumerate(table_rows(table))]
