"""``attnres-export --fuse-norm``: every aggregation and the RMSNorm after it become one AttnResAggregateNorm node,
the export still matches PyTorch, and the same nodes decompose and recompose through the portable target."""

from __future__ import annotations

import onnx
import pytest
from typer.testing import CliRunner

from attnres_export.cli import app
from attnres_export.dims import DimRange
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.graphs.onnx_utils import attnres_nodes
from attnres_export.graphs.targets import convert
from attnres_export.graphs.types import value_types
from tests.conftest import slow_after, write_checkpoint

RANGES = {"batch": DimRange(1, 2, 3), "seq": DimRange(1, 5, 16)}
NORM_OPS = {"ReduceMean", "Sqrt", "Reciprocal", "Pow"}
"""What the exported RMSNorm is made of; with every norm fused, none is left."""


@pytest.fixture(scope="module")
def block4_tail(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("fused_norm") / "m.pt", seed=4, n_layers=3, block_size=4)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", slow_after(["float32", "float16", "bfloat16"]))
def test_fused_norm_export_has_one_node_per_aggregation_and_no_norm_left_and_passes_parity(block4_tail, tmp_path,
                                                                                           dtype):
    out = tmp_path / "m.onnx"
    result = export_checkpoint(ExportOptions(block4_tail, out, dtype=dtype, batch=RANGES["batch"], seq=RANGES["seq"],
                                             fuse_norm=True))
    assert result.report is not None and result.report.ok, result.report.to_dict()
    assert result.fused_by_type == {"AttnResAggregateNorm": 7}
    model = onnx.load(str(out))
    nodes = attnres_nodes(model.graph)
    assert [len(n.input) - 2 for n in nodes] == [1, 2, 2, 2, 2, 3, 3]
    assert not NORM_OPS & {n.op_type for n in model.graph.node}
    types = value_types(model)
    assert {types[n.input[1]] for n in nodes} == {onnx.TensorProto.FLOAT}
    assert all(len(n.output) == 1 for n in nodes)


@pytest.mark.slow
def test_fused_norm_portable_export_decomposes_and_recomposes(block4_tail, tmp_path):
    out = tmp_path / "p.onnx"
    result = export_checkpoint(ExportOptions(block4_tail, out, target="portable", batch=RANGES["batch"],
                                             seq=RANGES["seq"], fuse_norm=True))
    assert result.report.ok
    model = onnx.load(str(out))
    assert {n.domain for n in model.graph.node} == {""}
    assert [n.op_type for n in attnres_nodes(convert(model, "tensorrt").graph)] == ["AttnResAggregateNorm"] * 7


@pytest.mark.slow
def test_fused_norm_with_past_export_passes_prefill_and_decode_parity(block4_tail, tmp_path):
    result = export_checkpoint(ExportOptions(block4_tail, tmp_path / "wp.onnx", batch=RANGES["batch"],
                                             seq=RANGES["seq"], past=DimRange(0, 6, 20), with_past=True,
                                             fuse_norm=True))
    assert result.report.ok and result.fused_by_type == {"AttnResAggregateNorm": 7}


def test_fuse_norm_on_a_model_without_aggregations_is_one_line_error(tmp_path):
    ckpt = write_checkpoint(tmp_path / "std.pt", n_layers=1, residual="standard")
    result = CliRunner().invoke(app, ["export", str(ckpt), "--fuse-norm", "--no-check"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "--fuse-norm" in lines[0] and "no depth aggregations" in lines[0] and "drop --fuse-norm" in lines[0]
    assert not list(tmp_path.glob("*.onnx"))


def test_fuse_norm_on_a_foreign_model_is_one_line_error(tmp_path):
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    source = tmp_path / "foreign.onnx"
    onnx.save(onnx.helper.make_model(graph), str(source))
    result = CliRunner().invoke(app, ["export", str(source), "-o", str(tmp_path / "out.onnx"), "--fuse-norm"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "is a foreign model (onnx)" in lines[0] and "drop --fuse-norm" in lines[0]
    assert not (tmp_path / "out.onnx").exists()
