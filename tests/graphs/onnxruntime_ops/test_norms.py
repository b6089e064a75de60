"""A residual sum and the RMSNorm of it become one ``SkipSimplifiedLayerNormalization`` whose outputs are the
NumPy RMSNorm of the sum and the sum itself; a norm of anything but a sum of two computed values stays."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from attnres_export.graphs.onnxruntime_ops.norms import simplified_layer_norms, skip_layer_norms

EPS = 1e-6


def residual_norm_model(hidden: int, constant_skip: bool = False):
    """``s = a + b`` (``b`` an initializer when ``constant_skip``), ``y = rmsnorm(s) * w`` in the seven nodes the
    export writes, ``z = s + y`` (the sum read again, as the next residual reads it)."""
    rng = np.random.default_rng(hidden)
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array(np.array(EPS, np.float32), "eps"),
             numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "w")]
    inputs = [oh.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", "seq", hidden])]
    if constant_skip:
        inits.append(numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b"))
    else:
        inputs.append(oh.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", "seq", hidden]))
    nodes = [oh.make_node("Add", ["a", "b"], ["s"]), oh.make_node("Pow", ["s", "two"], ["p"]),
             oh.make_node("ReduceMean", ["p", "axes"], ["m"]), oh.make_node("Add", ["m", "eps"], ["me"]),
             oh.make_node("Sqrt", ["me"], ["r"]), oh.make_node("Reciprocal", ["r"], ["ir"]),
             oh.make_node("Mul", ["s", "ir"], ["n"]), oh.make_node("Mul", ["n", "w"], ["y"]),
             oh.make_node("Add", ["s", "y"], ["z"])]
    outputs = [oh.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "z")]
    graph = oh.make_graph(nodes, "residual_norm", inputs, outputs, inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize(("batch", "seq", "hidden"), [(1, 1, 8), (3, 7, 33), (2, 5, 64)])
def test_a_norm_of_a_residual_sum_becomes_one_skip_norm_giving_the_numpy_norm_and_the_sum(batch, seq, hidden):
    model = residual_norm_model(hidden)
    assert simplified_layer_norms(model) == 1 and skip_layer_norms(model) == 1
    assert sorted(n.op_type for n in model.graph.node) == ["Add", "SkipSimplifiedLayerNormalization"]
    rng = np.random.default_rng(batch * seq)
    a, b = (rng.standard_normal((batch, seq, hidden)).astype(np.float32) for _ in range(2))
    y, z = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        ["y", "z"], {"a": a, "b": b})
    s = a.astype(np.float64) + b
    w = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w"))
    expected = s / np.sqrt((s ** 2).mean(-1, keepdims=True) + EPS) * w
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z, s + expected, rtol=1e-5, atol=1e-5)


def test_a_norm_of_a_sum_with_a_constant_stays_a_plain_norm():
    model = residual_norm_model(8, constant_skip=True)
    assert simplified_layer_norms(model) == 1 and skip_layer_norms(model) == 0
    assert "SimplifiedLayerNormalization" in [n.op_type for n in model.graph.node]
