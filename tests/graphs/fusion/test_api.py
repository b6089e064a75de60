"""The Python API exports a module that exists only in this process and fuses an in-memory ONNX, returning the
result objects the CLI prints; the export is checked against the module itself."""

from __future__ import annotations

import onnx
import pytest

from attnres_export.api import export, fuse
from attnres_export.ops.opset import AGGREGATE
from tests.graphs.fusion.foreign_models import StackEinsumLM, example_ids
from tests.graphs.fusion.helpers import dynamic_shapes, fused_count, matches_torch, plain_onnx


@pytest.mark.slow
def test_export_of_an_in_process_module_fuses_every_aggregation_and_checks_against_it(tmp_path):
    model = StackEinsumLM().eval()
    result = export(model, (example_ids(),), tmp_path / "m.onnx", dynamic_shapes=dynamic_shapes())
    assert result.path == tmp_path / "m.onnx" and result.report.ok
    assert result.report.extra["reference"] == "the PyTorch module"
    assert result.fusion.fused_by_op == {AGGREGATE: model.aggregations}
    written = onnx.load(str(result.path))
    assert fused_count(written) == model.aggregations and matches_torch(written, model)


@pytest.mark.slow
def test_fuse_of_an_in_memory_onnx_returns_the_fused_model_and_its_parity():
    fusion, report = fuse(plain_onnx(StackEinsumLM, opset=18))
    assert report.ok and fusion.fused_by_op == {AGGREGATE: StackEinsumLM.aggregations}
    assert fused_count(fusion.model) == StackEinsumLM.aggregations
