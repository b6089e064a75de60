"""Every Hugging Face family exports in float16 and bfloat16 and passes its dtype's bar against the float64
PyTorch model (the export's own check: bfloat16 through the emulation, inside the experts' subgraphs too). Slow: an
export per family and dtype."""

from __future__ import annotations

import json

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


def test_the_k3_example_in_bfloat16_passes_at_a_bar_scaled_by_bfloat16_pytorchs_own_error(tmp_path):
    """The 7-layer K3 example's bfloat16 logits are about 0.03 to 0.04 from float64 at 1x64, as are bfloat16
    PyTorch's own (the residual stream is stored in bfloat16): the bar is twice PyTorch's error in the artifact's
    type where that exceeds the fixed 2e-2 (docs/parity.md#pass-bars)."""
    folder, onnx, report = tmp_path / "k3", tmp_path / "k3.onnx", tmp_path / "r.json"
    runner = CliRunner()
    made = runner.invoke(app, ["example", str(folder), "--arch", "kimi-k3", "--layers", "7", "--block-size", "3"])
    assert made.exit_code == 0, made.output
    result = runner.invoke(app, ["export", str(folder), "--dtype", "bfloat16", "-o", str(onnx), "--report",
                                 str(report)])
    assert result.exit_code == 0, result.output
    checks = json.loads(report.read_text())["checks"]
    logits = [c["outputs"]["logits"] for c in checks]
    assert len(logits) == 2 and all(m["ok"] for m in logits)
    for m in logits:
        assert 0 < m["pytorch_same_type_rel_l2"] < 0.1
        assert m["rel_l2_bar"] == max(2e-2, 4 * m["pytorch_float32_rel_l2"], 2 * m["pytorch_same_type_rel_l2"])
