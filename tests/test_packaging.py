"""A wheel (not only an editable install) carries every subpackage: each folder of modules is a package."""

from __future__ import annotations

from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]


def test_every_folder_with_modules_is_found_as_a_package():
    found = set(find_packages(str(ROOT), include=["attnres_export*"]))
    folders = {p.parent for p in (ROOT / "attnres_export").rglob("*.py") if "__pycache__" not in p.parts}
    expected = {".".join(folder.relative_to(ROOT).parts) for folder in folders}
    assert expected <= found, f"folders without __init__.py: {sorted(expected - found)}"
