"""Export + ONNX Runtime parity for Full, Block (S = 1, 2, 4 with a short tail) and standard models,
in every dtype and both targets; and the structure the tensorrt target promises."""

from __future__ import annotations

import json

import onnx
import pytest

from attnres_export.exporter.export import ExportOptions, export_checkpoint
from attnres_export.exporter.ranges import DimRange
from attnres_export.graphs.onnx_utils import attnres_nodes, attribute
from tests.conftest import write_checkpoint

MODELS = {
    "full": {"n_layers": 2, "block_size": 0},
    "block1": {"n_layers": 2, "block_size": 1},
    "block2": {"n_layers": 2, "block_size": 2},
    "block4_tail": {"n_layers": 3, "block_size": 4},
    "standard": {"n_layers": 2, "residual": "standard"},
}
ELEM = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16,
        "bfloat16": onnx.TensorProto.BFLOAT16}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("export_models")
    return {name: write_checkpoint(root / f"{name}.pt", seed=i, **cfg) for i, (name, cfg) in enumerate(MODELS.items())}


@pytest.mark.parametrize("target", ["tensorrt", "portable"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_export_matches_pytorch_on_onnx_runtime(checkpoints, tmp_path, name, dtype, target):
    out = tmp_path / f"{name}.onnx"
    result = export_checkpoint(ExportOptions(checkpoints[name], out, target=target, dtype=dtype,
                                             batch=DimRange(1, 2, 3), seq=DimRange(1, 5, 16)))
    report = result.report
    assert report is not None and report.ok, report.to_dict()
    assert [c.shape for c in report.checks] == [[2, 5], [3, 1]]
    model = onnx.load(str(out))
    fused = attnres_nodes(model.graph)
    assert result.fused_nodes == result.expected_aggregations
    assert len(fused) == (result.fused_nodes if target == "tensorrt" else 0)
    weight_types = {i.data_type for i in model.graph.initializer if i.name in ("embed.weight", "norm.weight")}
    assert weight_types == {ELEM[dtype]}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tensorrt_target_writes_one_plugin_node_per_aggregation_with_separate_sources(checkpoints, tmp_path, dtype):
    out = tmp_path / "m.onnx"
    export_checkpoint(ExportOptions(checkpoints["block4_tail"], out, dtype=dtype, check=False))
    model = onnx.load(str(out))
    nodes = attnres_nodes(model.graph)
    assert [len(n.input) - 1 for n in nodes] == [1, 2, 2, 2, 2, 3, 3]
    producers = {o: n for n in model.graph.node for o in n.output}
    initializers = {i.name: i for i in model.graph.initializer}
    for node in nodes:
        assert attribute(node, "plugin_version") == b"1"
        assert attribute(node, "plugin_namespace") == b"attnres"
        assert attribute(node, "eps") == pytest.approx(1e-6)
        score_weight = initializers[node.input[0]]
        assert score_weight.data_type == onnx.TensorProto.FLOAT and list(score_weight.dims) == [32]
        for source in node.input[1:]:
            assert producers[source].op_type not in ("Concat", "ConcatFromSequence", "Unsqueeze")
    assert {(e.domain, e.version) for e in model.opset_import} >= {("attnres", 1), ("", 18)}
    assert not model.functions
    meta = json.loads({p.key: p.value for p in model.metadata_props}["attnres.export"])
    assert meta["dims"]["batch"] == [1, 1, 8] and meta["dtype"] == dtype
    dims = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq"]


def test_portable_target_uses_only_standard_ops_for_the_requested_opset(checkpoints, tmp_path):
    out = tmp_path / "p.onnx"
    export_checkpoint(ExportOptions(checkpoints["full"], out, target="portable", opset=21, check=False))
    model = onnx.load(str(out))
    assert {n.domain for n in model.graph.node} <= {""}
    assert {e.domain for e in model.opset_import} == {""}
    assert [e.version for e in model.opset_import] == [21]
    assert any(n.op_type == "ReduceSumSquare" for n in model.graph.node)


def test_export_reports_a_single_token_check_and_writes_the_json_report(checkpoints, tmp_path):
    result = export_checkpoint(ExportOptions(checkpoints["block2"], tmp_path / "m.onnx", seq=DimRange(1, 4, 8)))
    result.report.write_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["ok"] is True
    assert [1, 1] in [c["shape"] for c in data["checks"]] or [8, 1] in [c["shape"] for c in data["checks"]]
    metrics = data["checks"][0]["outputs"]["logits"]
    assert set(metrics) >= {"max_abs", "max_rel", "rel_l2", "cosine", "ok"}
