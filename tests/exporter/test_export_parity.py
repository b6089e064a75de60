"""Export + ONNX Runtime parity for Full, Block (S = 1, 2, 4 with a short tail) and standard models,
in every dtype and both targets; and the structure the tensorrt target promises."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from attnres_export.dims import DimRange
from attnres_export.exporter.checkpoint import check_export, export_checkpoint
from attnres_export.exporter.options import ExportOptions, ExportResult
from attnres_export.graphs.onnx_utils import attnres_nodes
from attnres_export.graphs.save import save_onnx_atomic
from attnres_export.graphs.targets import convert
from attnres_export.models.store import open_checkpoint
from attnres_export.ops.onnx_nodes import attribute
from tests.conftest import slow_after, write_checkpoint

MODELS = {
    "full": {"n_layers": 2, "block_size": 0},
    "block1": {"n_layers": 2, "block_size": 1},
    "block2": {"n_layers": 2, "block_size": 2},
    "block4_tail": {"n_layers": 3, "block_size": 4},
    "standard": {"n_layers": 2, "residual": "standard"},
}
RANGES = {"batch": DimRange(1, 2, 3), "seq": DimRange(1, 5, 16)}
ELEM = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16,
        "bfloat16": onnx.TensorProto.BFLOAT16}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("export_models")
    return {name: write_checkpoint(root / f"{name}.pt", seed=i, **cfg) for i, (name, cfg) in enumerate(MODELS.items())}


@pytest.fixture(scope="module")
def exported(checkpoints, tmp_path_factory):
    """``exported(name, dtype)``: the tensorrt-target export of a model, made once and shared by both targets."""
    root = tmp_path_factory.mktemp("exported")
    cache = {}

    def get(name: str, dtype: str) -> tuple[ExportResult, Path]:
        if (name, dtype) not in cache:
            out = root / f"{name}.{dtype}.onnx"
            cache[name, dtype] = export_checkpoint(ExportOptions(checkpoints[name], out, dtype=dtype,
                                                                 batch=RANGES["batch"], seq=RANGES["seq"])), out
        return cache[name, dtype]

    return get


FAST = {("block4_tail", "float32")}
"""The case the fast loop (-m "not slow") keeps: Block AttnRes with a short tail block, in float32."""


@pytest.mark.parametrize("target", ["tensorrt", "portable"])
@pytest.mark.parametrize(("name", "dtype"), [
    pytest.param(name, dtype, marks=() if (name, dtype) in FAST else pytest.mark.slow)
    for name in MODELS for dtype in ("float32", "float16", "bfloat16")
])
def test_export_matches_pytorch_on_onnx_runtime(exported, checkpoints, tmp_path, name, dtype, target):
    result, path = exported(name, dtype)
    report = result.report
    if target == "portable":
        path = tmp_path / f"{name}.portable.onnx"
        save_onnx_atomic(convert(onnx.load(str(result.path)), "portable"), path)
        options = ExportOptions(checkpoints[name], path, target=target, dtype=dtype, batch=RANGES["batch"],
                                seq=RANGES["seq"])
        report = check_export(open_checkpoint(checkpoints[name]), path, options)
    assert report is not None and report.ok, report.to_dict()
    assert [c.shape for c in report.checks] == [[2, 5], [3, 1]]
    model = onnx.load(str(path))
    fused = attnres_nodes(model.graph)
    assert result.fused_nodes == result.expected_aggregations
    assert len(fused) == (result.fused_nodes if target == "tensorrt" else 0)
    weight_types = {i.data_type for i in model.graph.initializer if i.name in ("embed.weight", "norm.weight")}
    assert weight_types == {ELEM[dtype]}


@pytest.mark.parametrize("dtype", slow_after(["float32", "bfloat16"]))
def test_tensorrt_target_writes_one_plugin_node_per_aggregation_with_separate_sources(exported, dtype):
    model = onnx.load(str(exported("block4_tail", dtype)[1]))
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
    assert meta["dims"]["batch"] == [1, 2, 3] and meta["dtype"] == dtype
    dims = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq"]


@pytest.mark.slow
def test_portable_target_uses_only_standard_ops_for_the_requested_opset(checkpoints, tmp_path):
    out = tmp_path / "p.onnx"
    export_checkpoint(ExportOptions(checkpoints["full"], out, target="portable", opset=21, check=False))
    model = onnx.load(str(out))
    assert {n.domain for n in model.graph.node} <= {""}
    assert {e.domain for e in model.opset_import} == {""}
    assert [e.version for e in model.opset_import] == [21]
    assert any(n.op_type == "ReduceSumSquare" for n in model.graph.node)


def test_export_reports_a_single_token_check_and_writes_the_json_report(exported, tmp_path):
    result, _ = exported("block4_tail", "float32")
    result.report.write_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["ok"] is True
    assert [3, 1] in [c["shape"] for c in data["checks"]]
    metrics = data["checks"][0]["outputs"]["logits"]
    assert set(metrics) >= {"max_abs", "max_rel", "rel_l2", "cosine", "ok"}
