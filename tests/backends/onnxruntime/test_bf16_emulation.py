"""The bfloat16 emulation rounds computed values inside control-flow subgraphs too: a mixture of experts' ``If``
(tested here on a small graph against NumPy with bfloat16 rounding written independently)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.backends.onnxruntime.bf16_emulation import emulate_bfloat16

BF16 = TensorProto.BFLOAT16


def round_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to bfloat16 on the float32 bit pattern (finite inputs)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def if_model() -> onnx.ModelProto:
    """``y = If(flag, then: x * w + w, else: x - w)`` in bfloat16; the branches read ``x`` and ``w`` from the
    enclosing graph, as the expert subgraphs do."""
    def branch(name: str, nodes: list[onnx.NodeProto], out: str) -> onnx.GraphProto:
        return oh.make_graph(nodes, name, [], [oh.make_tensor_value_info(out, BF16, None)])

    then = branch("then", [oh.make_node("Mul", ["x", "w"], ["xw"]), oh.make_node("Add", ["xw", "w"], ["t"])], "t")
    other = branch("else", [oh.make_node("Sub", ["x", "w"], ["e"])], "e")
    graph = oh.make_graph(
        [oh.make_node("Cast", ["x32"], ["x"], to=BF16), oh.make_node("Cast", ["w32"], ["w"], to=BF16),
         oh.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)],
        "g", [oh.make_tensor_value_info("x32", TensorProto.FLOAT, [3, 5]),
              oh.make_tensor_value_info("w32", TensorProto.FLOAT, [3, 5]),
              oh.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [oh.make_tensor_value_info("y", BF16, [3, 5])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


@pytest.mark.parametrize("flag", [True, False])
def test_an_if_of_bfloat16_ops_runs_on_onnx_runtime_and_rounds_each_op_inside_its_branches(flag):
    rng = np.random.default_rng(7)
    x, w = (rng.standard_normal((3, 5)).astype(np.float32) for _ in range(2))
    session = onnxruntime.InferenceSession(emulate_bfloat16(if_model()).SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x32": x, "w32": w, "flag": np.array(flag)})
    xb, wb = round_to_bfloat16(x), round_to_bfloat16(w)
    want = round_to_bfloat16(round_to_bfloat16(xb * wb) + wb) if flag else round_to_bfloat16(xb - wb)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, want)
