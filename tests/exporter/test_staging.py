"""The export's weights go to disk once and come back only where a file needs them: the external-data writer,
the staged publish (inline and external) and ONNX Runtime on a staged file all keep every value exact."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper as oh
from onnx import numpy_helper as nh

from attnres_export.backends.onnxruntime import runner as onnxruntime_runner
from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.exporter.staging import Stage
from attnres_export.graphs import onnx_utils
from attnres_export.graphs.external_save import save_with_external_data
from attnres_export.graphs.types import value_infos

SHAPES = {"w1": (300, 70), "w2": (70, 1000), "b2": (1000,), "one": (1,)}


def mlp(dtype=np.float32, seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x [B, 300] -> MatMul w1 -> Relu -> MatMul w2 + b2 -> * one: weights over and under every threshold here."""
    rng = np.random.default_rng(seed)
    weights = {name: rng.standard_normal(shape).astype(dtype) for name, shape in SHAPES.items()}
    elem = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [oh.make_node("MatMul", ["x", "w1"], ["h"]), oh.make_node("Relu", ["h"], ["r"]),
             oh.make_node("MatMul", ["r", "w2"], ["m"]), oh.make_node("Add", ["m", "b2"], ["a"]),
             oh.make_node("Mul", ["a", "one"], ["y"])]
    graph = oh.make_graph(nodes, "mlp", [oh.make_tensor_value_info("x", elem, ["batch", 300])],
                          [oh.make_tensor_value_info("y", elem, ["batch", 1000])],
                          [nh.from_array(value, name) for name, value in weights.items()])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]), weights


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {init.name: nh.to_array(init) for init in model.graph.initializer}


def test_external_data_writer_leaves_the_model_untouched_and_round_trips_every_weight_page_aligned(tmp_path):
    model, weights = mlp(np.float16)
    before = model.SerializeToString()
    save_with_external_data(model, tmp_path / "m.onnx", "m.onnx.data")
    assert model.SerializeToString() == before
    stubs = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False).graph.initializer
    offsets = [int(e.value) for s in stubs for e in s.external_data if e.key == "offset"]
    assert len(offsets) == 3 and all(o % 4096 == 0 for o in offsets)
    loaded = initializers(onnx.load(str(tmp_path / "m.onnx")))
    for name, value in weights.items():
        np.testing.assert_array_equal(loaded[name], value)


def test_value_infos_of_a_weightless_copy_equal_those_of_the_whole_model():
    model, _ = mlp()
    assert onnx_utils.weightless_copy(model).ByteSize() < model.ByteSize() / 50
    infos = value_infos(model)
    assert infos["y"].elem_type == onnx.TensorProto.FLOAT and infos["w2"].shape == (70, 1000)
    assert infos["h"].shape == (None, 70)


@pytest.fixture
def staged(tmp_path):
    """A staged model (as ``attnres-export`` writes it) and its weights."""
    model, weights = mlp(np.float16, seed=3)
    stage = Stage(tmp_path / "stage", "out.onnx")
    stage.path.parent.mkdir()
    graph = stage.write_traced(ir.from_proto(model))
    assert all(init.data_location == onnx.TensorProto.EXTERNAL for init in graph.graph.initializer
               if init.name != "one")
    return stage, weights


def test_a_small_staged_model_is_published_as_one_file_with_every_weight_inline(staged, tmp_path):
    stage, weights = staged
    target = tmp_path / "published.onnx"
    assert stage.publish(target) == [target]
    assert not (tmp_path / "published.onnx.data").exists()
    model = onnx.load(str(target), load_external_data=False)
    assert all(init.data_location == onnx.TensorProto.DEFAULT for init in model.graph.initializer)
    onnx.checker.check_model(model, full_check=True)
    loaded = initializers(model)
    assert sorted(loaded) == sorted(weights)
    for name, value in weights.items():
        np.testing.assert_array_equal(loaded[name], value)


def test_a_one_file_publish_writes_the_weights_once_by_renaming_the_staged_data_file(staged, tmp_path):
    stage, weights = staged
    data = stage.path.parent / stage.data_name
    staged_inode, staged_size = data.stat().st_ino, data.stat().st_size
    assert staged_size < sum(value.nbytes for value in weights.values()) + 1000
    target = tmp_path / "once.onnx"
    stage.publish(target)
    assert target.stat().st_ino == staged_inode and target.stat().st_size > staged_size
    loaded = initializers(onnx.load(str(target)))
    for name, value in weights.items():
        np.testing.assert_array_equal(loaded[name], value)


def test_a_one_file_publish_keeps_a_subgraphs_large_initializer_inline_in_its_subgraph(tmp_path):
    rng = np.random.default_rng(5)
    branch_weight = rng.standard_normal(301).astype(np.float32)
    outer_weight = rng.standard_normal(257).astype(np.float32)

    def branch(name: str) -> onnx.GraphProto:
        return oh.make_graph([oh.make_node("Add", ["x", f"{name}_w"], [f"{name}_y"])], name, [],
                             [oh.make_tensor_value_info(f"{name}_y", onnx.TensorProto.FLOAT, [301])],
                             [nh.from_array(branch_weight * (2 if name == "else" else 1), f"{name}_w")])

    graph = oh.make_graph(
        [oh.make_node("If", ["cond"], ["y"], then_branch=branch("then"), else_branch=branch("else")),
         oh.make_node("Mul", ["y", "scale"], ["z"])], "branchy",
        [oh.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
         oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [301])],
        [oh.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [301])],
        [nh.from_array(np.resize(outer_weight, 301), "scale")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    stage = Stage(tmp_path / "stage", "out.onnx")
    stage.path.parent.mkdir()
    stage.write_traced(ir.from_proto(model))
    target = tmp_path / "branchy.onnx"
    assert stage.publish(target) == [target]
    published = onnx.load(str(target), load_external_data=False)
    onnx.checker.check_model(published, full_check=True)
    branches = {attr.name: attr.g for attr in published.graph.node[0].attribute}
    assert all(init.data_location == onnx.TensorProto.DEFAULT for g in [published.graph, *branches.values()]
               for init in g.initializer)
    np.testing.assert_array_equal(nh.to_array(branches["else_branch"].initializer[0]), branch_weight * 2)
    np.testing.assert_array_equal(initializers(published)["scale"], np.resize(outer_weight, 301))


def test_a_staged_model_over_the_limit_is_published_with_its_data_file_renamed_to_match(staged, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.setattr(onnx_utils, "PROTOBUF_LIMIT", 10_000)
    monkeypatch.setattr(onnx_utils, "EXTERNAL_DATA_MARGIN", 0)
    stage, weights = staged
    target = tmp_path / "big.onnx"
    assert stage.publish(target) == [target, tmp_path / "big.onnx.data"]
    assert list(stage.path.parent.iterdir()) == []
    locations = {e.value for init in onnx.load(str(target), load_external_data=False).graph.initializer
                 for e in init.external_data if e.key == "location"}
    assert locations == {"big.onnx.data"}
    loaded = initializers(onnx.load(str(target)))
    for name, value in weights.items():
        np.testing.assert_array_equal(loaded[name], value)


def _reference_mlp(x: np.ndarray, weights: dict[str, np.ndarray]) -> np.ndarray:
    """The float16 MLP in NumPy, rounding to float16 after each op as the graph stores it."""
    h = np.maximum(x.astype(np.float32) @ weights["w1"].astype(np.float32), 0).astype(np.float16)
    m = (h.astype(np.float32) @ weights["w2"].astype(np.float32)).astype(np.float16)
    return ((m + weights["b2"]) * weights["one"]).astype(np.float32)


@pytest.mark.parametrize("writable", [True, False])
def test_onnx_runtime_runs_a_staged_file_from_its_weightless_graph_and_leaves_no_scratch_file(staged, monkeypatch,
                                                                                             writable):
    stage, weights = staged
    if not writable:
        def read_only(*_args, **_kw):
            raise PermissionError("read-only folder")
        monkeypatch.setattr(onnxruntime_runner, "scratch_file_beside", read_only)
    runner = OnnxRuntimeRunner(stage.path)
    assert runner._model.ByteSize() < 10_000
    x = np.random.default_rng(1).standard_normal((2, 300)).astype(np.float16)
    with runner:
        got = runner.infer({"x": x})["y"]
    np.testing.assert_allclose(got.astype(np.float32), _reference_mlp(x, weights), rtol=2e-2, atol=5e-2)
    assert sorted(p.name for p in stage.path.parent.iterdir()) == ["out.onnx", "out.onnx.data"]
