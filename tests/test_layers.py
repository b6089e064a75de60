"""The package's layers (docs/architecture.md) hold: import-linter's contracts in pyproject.toml are kept."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The script beside this interpreter first, so the test runs when the venv is used without being activated.
LINT_IMPORTS = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")


@pytest.mark.skipif(LINT_IMPORTS is None, reason="import-linter is missing: pip install -e .[test]")
def test_import_contracts_are_kept() -> None:
    result = subprocess.run([LINT_IMPORTS], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout
