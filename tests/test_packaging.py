"""A wheel (not only an editable install) carries every subpackage: each folder of modules is a package."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from setuptools import find_packages

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_folder_with_modules_is_found_as_a_package():
    found = set(find_packages(str(ROOT), include=["attnres_export*"]))
    folders = {p.parent for p in (ROOT / "attnres_export").rglob("*.py") if "__pycache__" not in p.parts}
    expected = {".".join(folder.relative_to(ROOT).parts) for folder in folders}
    assert expected <= found, f"folders without __init__.py: {sorted(expected - found)}"


TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".yaml", ".cpp", ".h", ".cu", ".cuh", ".cfg"}
OLD_IMPORT = re.compile(r"(?<![\w.])(import attnres\b(?!_export)|from attnres(\.\w+)* import|"
                        r"attnres\.(cli|ops|models|graphs|exporter|parity|engine|plugins|backends|errors|io)\b|"
                        r"(?<![\w/.-])attnres/(cli|ops|models|graphs|exporter|parity|engine|plugins|backends))")
"""Python imports and source paths of the package under its old name ``attnres`` (the ONNX domain, the
plugin namespace, the torch op namespace ``attnres::`` and the command ``attnres`` keep that name)."""


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = [ROOT / name for name in listed.splitlines()]
    return [f for f in files if f.is_file() and f != Path(__file__).resolve()
            and (f.suffix in TEXT_SUFFIXES or f.parent.name == ".ci")]


def test_the_import_name_attnres_export_is_used_everywhere() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["project"]["name"] == "attnres-export"
    assert set(config["project"]["scripts"].values()) == {"attnres_export.cli:main", "attnres_export.cli:export_main"}
    assert list(config["tool"]["setuptools"]["package-data"]) == ["attnres_export.plugins"]
    assert not (ROOT / "attnres").exists()
    stale = [f"{f.relative_to(ROOT)}:{n}" for f in tracked_text_files()
             for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1) if OLD_IMPORT.search(line)]
    assert stale == []


def test_code_and_docs_cite_only_documents_inside_the_repository() -> None:
    outside = re.compile(r"\bSPEC \d|\.\./shared|\bthe brief\b")
    cited = [f"{f.relative_to(ROOT)}:{n}" for f in tracked_text_files()
             for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1) if outside.search(line)]
    assert cited == []
