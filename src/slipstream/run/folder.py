"""A run's folder: `run.dir`, or a fresh `runs/<UTC time>`, with the resolved config.toml and
`launch.json` (each written whole or not at all: `write_atomic`): the folder the run was
started in, against which its relative paths (`model.path=model`, `task.reward="rewards.py:fn"`)
resolve, so `--resume` from anywhere finds them (`started_in`). A resumed run writes its
config.toml once its checkpoint is restored (`run.resume.restore`), so a resume that fails
before leaves the run's own."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
from pathlib import Path

from slipstream.config import Config, dump_config
from slipstream.files import write_atomic


def make_run_dir(cfg: Config, config: bool = True) -> Path:
    """`run.dir`, or a new `runs/<UTC time>` (`-2`, `-3`... for runs started in one second);
    with `config`, its config.toml written (`write_config`)."""
    if cfg.run.dir:
        path = Path(cfg.run.dir)
        path.mkdir(parents=True, exist_ok=True)
    else:
        path = _new_folder(Path("runs") / dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S"))
    cfg.run.dir = str(path)
    if config:
        write_config(path, cfg)
    launch = path / "launch.json"
    if not launch.exists():  # a resumed run keeps the folder it was first started in
        write_atomic(launch, json.dumps({"cwd": os.getcwd()}))
    return path


def write_config(run_dir: Path, cfg: Config) -> None:
    """The run's resolved config, `run_dir/config.toml`."""
    write_atomic(run_dir / "config.toml", dump_config(cfg))


def started_in(run_dir: Path) -> Path | None:
    """The folder the run in `run_dir` was started in (`launch.json`), where it still exists;
    None for a run written before it was recorded."""
    try:
        cwd = Path(json.loads((run_dir / "launch.json").read_text(encoding="utf-8"))["cwd"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return cwd if cwd.is_dir() else None


def _new_folder(base: Path) -> Path:
    """`base`, or `base-N` with the first free N, made here (exclusively: two processes
    starting in one second get two folders)."""
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")
