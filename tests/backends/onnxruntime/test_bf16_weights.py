"""The bfloat16 emulation keeps the weights bfloat16: each bfloat16 initializer is read through a ``Cast`` to
float32 that the check's session does not constant-fold, so ONNX Runtime holds no float32 copy of the weights
(docs/onnx-runtime-notes.md, "bfloat16 on the CPU provider"). Values are checked against NumPy with bfloat16
rounding written independently; the memory test reads the process's anonymous (not file-backed) pages."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.graphs.external_save import save_with_external_data

BF16 = TensorProto.BFLOAT16


def round_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to bfloat16 on the float32 bit pattern (finite inputs)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def bfloat16_tensor(name: str, values: np.ndarray) -> onnx.TensorProto:
    """``values`` (already bfloat16-exact) as a bfloat16 initializer."""
    bits = (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    tensor = oh.make_tensor(name, BF16, values.shape, bits.tobytes(), raw=True)
    return tensor


def matmul_if_model(w: np.ndarray, bias: np.ndarray) -> onnx.ModelProto:
    """``y = If(flag, then: (x @ w) + bias, else: (x @ w) - bias)`` with ``w`` and ``bias`` bfloat16 initializers of
    the main graph, ``bias`` read only inside the branches (as the experts' weights are)."""
    def branch(name: str, nodes: list[onnx.NodeProto], out: str) -> onnx.GraphProto:
        return oh.make_graph(nodes, name, [], [oh.make_tensor_value_info(out, BF16, None)])

    then = branch("then", [oh.make_node("Add", ["xw", "bias"], ["t"])], "t")
    other = branch("else", [oh.make_node("Sub", ["xw", "bias"], ["e"])], "e")
    rows, cols = w.shape
    graph = oh.make_graph(
        [oh.make_node("Cast", ["x32"], ["x"], to=BF16), oh.make_node("MatMul", ["x", "w"], ["xw"]),
         oh.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)],
        "g", [oh.make_tensor_value_info("x32", TensorProto.FLOAT, ["n", rows]),
              oh.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [oh.make_tensor_value_info("y", BF16, ["n", cols])],
        initializer=[bfloat16_tensor("w", w), bfloat16_tensor("bias", bias)])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def anonymous_bytes() -> int:
    """This process's resident anonymous memory (heap and private maps, not pages mapped from files)."""
    with open("/proc/self/smaps_rollup") as rollup:
        line = next(line for line in rollup if line.startswith("Anonymous:"))
    return int(line.split()[1]) * 1024


@pytest.mark.parametrize("external", [False, True])
@pytest.mark.parametrize(("rows", "cols", "tokens", "flag"), [(8, 5, 1, True), (33, 17, 4, True), (33, 17, 3, False)])
def test_bfloat16_weights_read_in_the_graph_and_its_branches_compute_as_numpy_with_bfloat16_rounding(
        tmp_path, external, rows, cols, tokens, flag):
    rng = np.random.default_rng(rows * 100 + tokens)
    w = round_to_bfloat16(rng.standard_normal((rows, cols)).astype(np.float32))
    bias = round_to_bfloat16(rng.standard_normal(cols).astype(np.float32))
    model = matmul_if_model(w, bias)
    path = tmp_path / "model.onnx"
    if external:
        save_with_external_data(model, path, "model.onnx.data", size_threshold=0)
    else:
        onnx.save_model(model, str(path))
    x = rng.standard_normal((tokens, rows)).astype(np.float32)
    with OnnxRuntimeRunner(path) as runner:
        y = runner.infer({"x32": x, "flag": np.array(flag)})["y"]
    xw = round_to_bfloat16((round_to_bfloat16(x).astype(np.float64) @ w).astype(np.float32))
    want = round_to_bfloat16(xw + bias if flag else xw - bias)
    assert runner.backend == "onnxruntime+bf16-emulation"
    np.testing.assert_array_equal(y, want)


def test_the_session_of_a_bfloat16_graph_holds_no_float32_copy_of_its_weights(tmp_path):
    rows, cols = 4096, 4096  # 32 MiB in bfloat16, 64 MiB as float32
    w = round_to_bfloat16(np.random.default_rng(3).standard_normal((rows, cols)).astype(np.float32))
    path = tmp_path / "model.onnx"
    save_with_external_data(matmul_if_model(w, np.zeros(cols, np.float32)), path, "model.onnx.data")
    runner = OnnxRuntimeRunner(path)
    before = anonymous_bytes()
    runner.activate()
    grown = anonymous_bytes() - before
    runner.deactivate()
    assert grown < w.nbytes // 4, f"the session took {grown / 2**20:.0f} MiB of anonymous memory"
