"""``exporter/sibling_matmul_nbits.py``: three ``MatMulNBits`` of one input with the same attributes become one node
and a ``Split`` that compute what they computed (ONNX Runtime runs both graphs), with and without zero points, at
several shapes; a pair, and nodes of another input, ``K`` or block size, or whose weights another node reads, stay;
each member's weights are computed once for all the stacked parts."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from attnres_export.exporter.sibling_matmul_nbits import pack_siblings
from attnres_export.exporter.staging import ComputedTensor

K, BLOCK, BITS = 64, 32, 4


def matmul_nbits(name: str, x: str, rows: int, rng: np.random.Generator, zero_points: bool, block: int = BLOCK,
                 k: int = K, accuracy_level: int = 4) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    blocks = -(-k // block)
    weights = [numpy_helper.from_array(rng.integers(0, 256, (rows, blocks, block * BITS // 8), dtype=np.uint8),
                                       f"{name}.B"),
               numpy_helper.from_array(rng.uniform(0.01, 0.1, rows * blocks).astype(np.float32), f"{name}.scales")]
    if zero_points:
        weights.append(numpy_helper.from_array(rng.integers(0, 256, (rows, -(-blocks * BITS // 8)), dtype=np.uint8),
                                               f"{name}.zero_points"))
    node = oh.make_node("MatMulNBits", [x, *(w.name for w in weights)], [name], domain="com.microsoft", name=name,
                        K=k, N=rows, bits=BITS, block_size=block, accuracy_level=accuracy_level)
    return node, weights


def model_of(zero_points: bool) -> onnx.ModelProto:
    """x feeds q (48 rows), k and v (16 rows each), a pair of block size 16 (up, gate) and lone, whose scales an
    Identity reads too; y (width 96) feeds another node. Only q, k and v are stacked."""
    rng = np.random.default_rng(0)
    nodes, weights = [], []
    for name, x, rows, block, k in [("q", "x", 48, BLOCK, K), ("k", "x", 16, BLOCK, K), ("v", "x", 16, BLOCK, K),
                                    ("up", "x", 40, 16, K), ("gate", "x", 40, 16, K), ("other", "y", 24, BLOCK, 96),
                                    ("lone", "x", 8, BLOCK, K)]:
        node, made = matmul_nbits(name, x, rows, rng, zero_points, block, k)
        nodes.append(node)
        weights += made
    nodes.append(oh.make_node("Identity", ["lone.scales"], ["lone_scales"]))
    outputs = ["q", "k", "v", "up", "gate", "other", "lone", "lone_scales"]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", K]),
                                       oh.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 96])],
                          [oh.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], weights)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21), oh.make_opsetid("com.microsoft", 1)])


def run(model: onnx.ModelProto, x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x, "y": y})


@pytest.mark.parametrize("zero_points", [False, True], ids=["symmetric", "zero-points"])
def test_sibling_matmul_nbits_become_one_node_and_a_split_that_compute_what_they_did(zero_points):
    before = model_of(zero_points)
    model = ir.serde.deserialize_model(before)
    renamed = pack_siblings(model.graph)
    after = ir.serde.serialize_model(model)
    assert renamed == {"q.B": "q.B.stacked", "k.B": "q.B.stacked", "v.B": "q.B.stacked"}
    kinds = Counter(n.op_type for n in after.graph.node)
    assert kinds == {"MatMulNBits": 5, "Split": 1, "Identity": 1}, kinds
    stacked = next(n for n in after.graph.node if n.op_type == "MatMulNBits" and n.input[1] == "q.B.stacked")
    assert {a.name: a.i for a in stacked.attribute}["N"] == 80
    assert not {"q.B", "k.B", "v.B", "q.scales"} & {i.name for i in after.graph.initializer}
    rng = np.random.default_rng(1)
    for batch, seq in [(1, 1), (2, 7), (3, 1)]:
        x = rng.standard_normal((batch, seq, K), dtype=np.float32)
        y = rng.standard_normal((batch, seq, 96), dtype=np.float32)
        for want, got in zip(run(before, x, y), run(after, x, y), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_each_members_weights_are_computed_once_for_all_stacked_parts():
    model = ir.serde.deserialize_model(model_of(zero_points=True))
    calls: Counter = Counter()
    for value in model.graph.initializers.values():
        array = value.const_value.numpy()

        def compute(name=value.name, array=array):
            calls[name] += 1
            return torch.from_numpy(array.copy())
        value.const_value = ComputedTensor(compute, value.const_value.dtype, value.shape, value.name)
    pack_siblings(model.graph)
    for name in ("q.B.stacked", "q.scales.stacked", "q.zero_points.stacked"):
        model.graph.initializers[name].const_value.numpy()
    assert calls == Counter({f"{member}.{part}": 1 for member in "qkv" for part in ("B", "scales", "zero_points")})
