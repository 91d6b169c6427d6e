"""What a built wheel holds: every package of the source tree (a folder without
`__init__.py` is skipped by setuptools' `packages.find`, and a non-editable install then
lacks it while an editable one still imports it from the tree)."""

from __future__ import annotations

from pathlib import Path

from setuptools import find_packages

SRC = Path(__file__).resolve().parents[1] / "src"


def test_every_source_folder_with_modules_is_a_package_the_wheel_ships() -> None:
    shipped = set(find_packages(where=str(SRC)))
    folders = {
        ".".join(d.relative_to(SRC).parts)
        for d in (SRC / "slipstream").rglob("*")
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
    }
    assert folders - shipped == set(), "folders with modules but no __init__.py"
    assert "slipstream.train" in shipped
