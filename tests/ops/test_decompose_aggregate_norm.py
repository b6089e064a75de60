"""The portable decomposition of AttnResAggregateNorm, and its ONNX Runtime reference op, compute the float64
reference's values, for y alone and for y with h."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.graphs.schemas import register_schemas
from attnres_export.graphs.targets import convert
from attnres_export.ops import attnres_aggregate_numpy_in
from attnres_export.ops.numpy_ref import rms_norm_numpy_in

ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
REL_L2 = {"float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}


def single_node_model(n: int, d: int, dtype: str, weights: tuple[np.ndarray, np.ndarray], opset: int,
                      with_h: bool) -> onnx.ModelProto:
    sources = [f"v{i}" for i in range(n)]
    outputs = ["y", "h"] if with_h else ["y"]
    node = oh.make_node("AttnResAggregateNorm", ["sw", "nw", *sources], outputs, name="aggn", domain="attnres",
                        eps=1e-6, norm_eps=1e-5, plugin_version="1", plugin_namespace="attnres")
    graph = oh.make_graph(
        [node], "g", [oh.make_tensor_value_info(s, ELEM[dtype], ["rows", d]) for s in sources],
        [oh.make_tensor_value_info(o, ELEM[dtype], ["rows", d]) for o in outputs],
        initializer=[numpy_helper.from_array(weights[0], "sw"), numpy_helper.from_array(weights[1], "nw")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset), oh.make_opsetid("attnres", 1)])


@pytest.mark.parametrize("dtype", list(ELEM))
@pytest.mark.parametrize(("n", "d", "rows", "opset", "with_h"), [
    (1, 64, 1, 18, False), (2, 1000, 3, 18, True), (5, 4096, 2, 23, False), (16, 33, 7, 17, True)])
@pytest.mark.parametrize("form", ["portable", "reference-op"])
def test_decomposition_and_reference_op_match_float64(form, n, d, rows, opset, with_h, dtype):
    register_schemas()
    gen = torch.Generator().manual_seed(n * 10 + d)
    sources = [(torch.randn(rows, d, generator=gen) * (1 + i)).to(TORCH[dtype]) for i in range(n)]
    score_weight = torch.randn(d, generator=gen) * (2.0 / d**0.5)
    weights = (score_weight.numpy(), (1 + 0.1 * torch.randn(d, generator=gen)).numpy())
    model = single_node_model(n, d, dtype, weights, opset, with_h)
    if form == "portable":
        model = convert(model, "portable")
        assert {node.domain for node in model.graph.node} == {""}
    feeds = {f"v{i}": s.float().numpy() if dtype == "bfloat16" else s.numpy() for i, s in enumerate(sources)}
    with OnnxRuntimeRunner(model) as runner:
        got = runner.infer(feeds)
    h = attnres_aggregate_numpy_in(np.float64, weights[0], [s.double().numpy() for s in sources], 1e-6)
    y = rms_norm_numpy_in(np.float64, h, weights[1], 1e-5)
    assert np.linalg.norm(got["y"].astype(np.float64) - y) / np.linalg.norm(y) <= REL_L2[dtype]
    assert ("h" in got) == with_h
    if with_h:
        assert np.linalg.norm(got["h"].astype(np.float64) - h) / np.linalg.norm(h) <= REL_L2[dtype]


def test_portable_round_trip_restores_the_node_with_both_outputs():
    register_schemas()
    model = single_node_model(3, 8, "float32", (np.ones(8, np.float32), np.ones(8, np.float32)), 18, True)
    back = convert(convert(model, "portable"), "tensorrt")
    (node,) = back.graph.node
    assert node.op_type == "AttnResAggregateNorm" and list(node.output) == ["y", "h"]
    assert [a.i for a in node.attribute if a.name == "has_aggregate"] == [1]
