"""`attnres convert`: targets round trip, and a portable file made from a tensorrt file computes the same."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.errors import GraphError
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.graphs.onnx_utils import attnres_nodes
from attnres_export.graphs.targets import convert, detect_target
from attnres_export.ops.opset import ORT_TRT_DOMAIN


@pytest.fixture(scope="module", params=["float16", pytest.param("float32", marks=pytest.mark.slow)])
def exported(request, block2_checkpoint, exported_onnx, tmp_path_factory) -> onnx.ModelProto:
    """The run's shared float16 export, or a float32 one of the same checkpoint."""
    if request.param == "float16":
        return onnx.load(str(exported_onnx))
    out = tmp_path_factory.mktemp("convert") / f"m_{request.param}.onnx"
    export_checkpoint(ExportOptions(block2_checkpoint, out, dtype=request.param, check=False))
    return onnx.load(str(out))


def run(model: onnx.ModelProto, ids: np.ndarray) -> np.ndarray:
    with OnnxRuntimeRunner(model) as runner:
        return runner.infer({"input_ids": ids})["logits"]


def signature(model: onnx.ModelProto) -> list[tuple]:
    return [(n.op_type, n.domain, tuple(n.input), tuple(n.output),
             sorted((a.name, onnx.helper.get_attribute_value(a)) for a in n.attribute))
            for n in attnres_nodes(model.graph)]


def test_portable_made_from_tensorrt_computes_the_same(exported):
    portable = convert(exported, "portable")
    assert detect_target(portable) == "portable" and not attnres_nodes(portable.graph)
    ids = np.random.default_rng(0).integers(0, 97, size=(2, 6))
    fused_out, portable_out = run(exported, ids), run(portable, ids)
    assert np.linalg.norm(fused_out - portable_out) / np.linalg.norm(fused_out) < 2e-3
    onnx.checker.check_model(portable, full_check=True)


def test_tensorrt_portable_tensorrt_round_trip_restores_the_fused_nodes(exported):
    back = convert(convert(exported, "portable"), "tensorrt")
    assert signature(back) == signature(exported)
    assert {e.domain for e in back.opset_import} == {e.domain for e in exported.opset_import}


def test_ort_trt_target_moves_nodes_to_the_trt_plugins_domain_and_back(exported):
    ort_trt = convert(exported, "ort-trt")
    nodes = attnres_nodes(ort_trt.graph, ORT_TRT_DOMAIN)
    assert len(nodes) == len(attnres_nodes(exported.graph)) and not attnres_nodes(ort_trt.graph)
    assert ORT_TRT_DOMAIN in {e.domain for e in ort_trt.opset_import}
    assert "attnres" not in {e.domain for e in ort_trt.opset_import}
    restored = convert(ort_trt, "tensorrt")
    assert [s[2:] for s in signature(restored)] == [s[2:] for s in signature(exported)]


def test_ort_trt_artifact_still_runs_on_onnx_runtime_with_the_reference_ops(exported):
    ids = np.random.default_rng(1).integers(0, 97, size=(1, 4))
    np.testing.assert_array_equal(run(convert(exported, "ort-trt"), ids), run(exported, ids))


def test_converting_a_foreign_graph_without_attnres_records_is_refused(exported):
    portable = convert(exported, "portable")
    del portable.metadata_props[:]
    with pytest.raises(GraphError, match="attnres fuse"):
        convert(portable, "tensorrt")


def test_unknown_target_is_refused(exported):
    with pytest.raises(GraphError, match="unknown target"):
        convert(exported, "tflite")


def test_converting_to_ort_trt_names_the_onnx_runtime_it_is_for_and_that_no_gpu_ran_it(exported, tmp_path):
    from typer.testing import CliRunner

    from attnres_export.cli import app

    source = tmp_path / "m.onnx"
    onnx.save(exported, str(source))
    result = CliRunner().invoke(app, ["convert", str(source), "--target", "ort-trt", "-o", str(tmp_path / "o.onnx")])
    assert result.exit_code == 0, result.output
    assert "from ONNX Runtime 1.22" in result.output and "trt_extra_plugin_lib_paths" in result.output
    assert "not yet run on a GPU" in result.output
