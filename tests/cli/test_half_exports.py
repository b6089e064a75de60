"""Every Hugging Face family exports in float16 and bfloat16 and passes its dtype's bar against the float64
PyTorch model (the export's own check: bfloat16 through the emulation, inside the experts' subgraphs too). Slow: an
export per family and dtype."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from attnres_export.cli import app
from tests.serve.family_exports import FAMILIES, example_folder

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_half_export_of_every_family_passes_its_bar(tmp_path, family, dtype):
    folder = example_folder(family, tmp_path / "folder")
    result = CliRunner().invoke(app, ["export", str(folder), "--dtype", dtype, "--seq", "1:8:32",
                                      "-o", str(tmp_path / "m.onnx"), "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "m.onnx").is_file() and '"ok": true' in (tmp_path / "r.json").read_text()
