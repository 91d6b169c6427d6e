"""Loading a user's object by name: `package.module:name` or `path/to/file.py:name` (whose
folder joins `sys.path`, at its end, so that the file imports the modules beside it)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


def load_object(
    spec: str,
    what: str,
    error: type[Exception],
    expected: str = "'module:name' or 'file.py:name'",
    noun: str = "",
) -> object:
    """The object `spec` names. Any problem raises `error` with a one-line message that starts
    with `what` (the setting or the thing being loaded) and says what was `expected`;
    `noun="function"` also requires the object to be callable."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise error(f"{what}: expected {expected}, got {spec!r}")
    if target.endswith(".py"):
        file = Path(target)
        if not file.exists():
            raise error(f"{what}: no such file {file}")
        folder = str(file.resolve().parent)
        if folder not in sys.path:  # its sibling modules import (`import helpers`), after
            sys.path.append(folder)  # the installed ones, which it cannot shadow
        mod_spec = importlib.util.spec_from_file_location(file.stem, file)
        assert mod_spec is not None and mod_spec.loader is not None
        module = importlib.util.module_from_spec(mod_spec)
        try:
            mod_spec.loader.exec_module(module)
        except Exception as e:  # the user's file raises as it runs: a SyntaxError, an import
            raise error(f"{what}: loading it raised {_describe(e)}") from None
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise error(f"{what}: cannot import {target!r} ({e})") from None
        except Exception as e:  # the module raises as it is imported
            raise error(f"{what}: loading it raised {_describe(e)}") from None
    obj = getattr(module, name, None)
    if obj is None or (noun == "function" and not callable(obj)):
        raise error(f"{what}: {target} has no {noun + ' ' if noun else ''}{name!r}")
    return obj


def _describe(e: BaseException) -> str:
    """`SyntaxError: invalid syntax (rewards.py, line 3)`: the exception in one line."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
