"""The reference's int8 activations (``parity/int8_activations.py``) against ONNX Runtime's own ``MatMulNBits`` at
``accuracy_level`` 4: the emulation is what the kernel computes, and the float32-activation product is not."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from attnres_export.errors import ParityError
from attnres_export.parity.int8_activations import (
    INT8_MAX,
    forced_roundings,
    int8_blocks,
    with_int8_activations,
)


def matmul_nbits_session(weight_values: np.ndarray, scales: np.ndarray, bits: int, block: int,
                         accuracy_level: int) -> ort.InferenceSession:
    """One ``MatMulNBits`` node over signed ``weight_values [N, K]`` with ``scales [N, blocks]``."""
    rows, columns = weight_values.shape
    blocks = scales.shape[1]
    unsigned = (weight_values + (1 << (bits - 1))).astype(np.uint8)
    unsigned = np.pad(unsigned, ((0, 0), (0, blocks * block - columns)), constant_values=1 << (bits - 1))
    unsigned = unsigned.reshape(rows, blocks, block)
    packed = unsigned[..., 0::2] | (unsigned[..., 1::2] << 4) if bits == 4 else unsigned
    node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain="com.microsoft", K=columns, N=rows,
                            bits=bits, block_size=block, accuracy_level=accuracy_level)
    graph = helper.make_graph(
        [node], "one_matmul_nbits", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", columns])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", rows])],
        [numpy_helper.from_array(packed.astype(np.uint8), "B"),
         numpy_helper.from_array(scales.reshape(-1).astype(np.float32), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft",
                                                                                                     1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def relative_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


@pytest.mark.parametrize(("tokens", "columns", "rows", "block", "bits"), [
    (1, 64, 32, 32, 4), (8, 896, 160, 32, 4), (3, 200, 48, 32, 4), (5, 128, 64, 16, 4), (2, 4864, 40, 128, 4),
    (1, 96, 24, 64, 4), (7, 200, 48, 32, 8),
])
def test_int8_blocks_reproduce_matmul_nbits_accuracy_level_4_and_the_float_product_does_not(
        tokens, columns, rows, block, bits):
    rng = np.random.default_rng([tokens, columns, rows, block, bits])
    values = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), size=(rows, columns))
    blocks = -(-columns // block)
    scales = ((rng.random((rows, blocks)) + 0.5) * 0.02).astype(np.float32)
    activations = rng.standard_normal((tokens, columns)).astype(np.float32)
    weight = values * np.repeat(scales.astype(np.float64), block, axis=1)[:, :columns]

    onnxruntime = matmul_nbits_session(values, scales, bits, block, 4).run(None, {"A": activations})[0]
    emulated = int8_blocks(torch.from_numpy(activations).double(), block).numpy() @ weight.T
    float_product = activations.astype(np.float64) @ weight.T

    assert relative_l2(onnxruntime, emulated) < 2e-6
    assert relative_l2(onnxruntime, float_product) > 1e-3


def test_accuracy_level_1_is_the_float_product_the_default_export_is_judged_against():
    rng = np.random.default_rng(1)
    values = rng.integers(-8, 8, size=(48, 200))
    scales = ((rng.random((48, 7)) + 0.5) * 0.02).astype(np.float32)
    activations = rng.standard_normal((3, 200)).astype(np.float32)
    weight = values * np.repeat(scales.astype(np.float64), 32, axis=1)[:, :200]
    onnxruntime = matmul_nbits_session(values, scales, 4, 32, 1).run(None, {"A": activations})[0]
    assert relative_l2(onnxruntime, activations.astype(np.float64) @ weight.T) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_int8_blocks_keep_zero_blocks_zero_give_each_block_127_steps_and_quantize_a_partial_block_alone(dtype):
    x = torch.zeros(2, 40, dtype=dtype)
    x[0, 3], x[0, 5] = 1.27, -0.5
    x[1, 33], x[1, 39] = 3.0, 1.0  # the partial block of 8 columns
    out = int8_blocks(x, 32)
    assert torch.equal(out[1, :32], torch.zeros(32, dtype=dtype))
    assert out[0, 3] == pytest.approx(1.27, rel=1e-6)
    assert out[0, 5] == pytest.approx(round(-0.5 / (1.27 / 127)) * 1.27 / 127, rel=1e-6)
    assert out[1, 33] == pytest.approx(3.0, rel=1e-6)
    assert out[1, 39] == pytest.approx(round(127 / 3) * 3 / 127, rel=1e-6)


class TwoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(64, 32, bias=False)
        self.second = nn.Linear(32, 8)
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x)) * self.scale


def test_with_int8_activations_quantizes_only_the_named_linears_inputs():
    torch.manual_seed(0)
    model = TwoLinears().double()
    x = torch.randn(3, 64, dtype=torch.float64)
    expected = model.second(model.first(int8_blocks(x, 32))) * model.scale
    with_int8_activations(model, {"first.weight": {"block": 32, "packed": "first.B"}})
    assert torch.equal(model(x), expected)


def test_with_int8_activations_refuses_a_weight_that_no_linear_owns():
    with pytest.raises(ParityError, match="scale: written as MatMulNBits with int8 activations, but it is not"):
        with_int8_activations(TwoLinears(), {"scale": {"block": 32, "packed": "scale.B"}})


def test_ties_round_half_to_even_after_multiplying_by_127_over_the_block_maximum_as_onnxruntime_does():
    """An identity int4 weight (scale 1) makes ``MatMulNBits``' output its own int8 activations times their scale,
    so ONNX Runtime's roundings can be read exactly; the inputs sit at half steps, where ``a / scale`` and
    ``a * (127 / max|a|)`` round differently."""
    rng = np.random.default_rng(3)
    columns = 32
    session = matmul_nbits_session(np.eye(columns, dtype=np.int64), np.ones((columns, 1), np.float32), 4, 32, 4)
    amax = (rng.random((4000, 1)) + 0.5).astype(np.float32)
    ties = ((rng.integers(-120, 120, size=(4000, columns)) + 0.5) * amax / np.float32(INT8_MAX)).astype(np.float32)
    ties[:, 0] = amax[:, 0]
    scale = np.abs(ties).max(1, keepdims=True) / np.float32(INT8_MAX)
    onnxruntime = np.rint(session.run(None, {"A": ties})[0] / scale)
    ours = np.rint(int8_blocks(torch.from_numpy(ties), 32).numpy() / scale)
    assert np.array_equal(ours, onnxruntime)


def test_forced_roundings_take_the_artifacts_value_only_at_a_tie_and_count_what_differs():
    torch.manual_seed(0)
    model = TwoLinears().double()
    with_int8_activations(model, {"first.weight": {"block": 32, "packed": "first.B"}})
    x = torch.randn(1, 64, dtype=torch.float64) * 0.1
    x[0, 0] = 1.0  # the first block's maximum: one step is 1/127
    x[0, 1] = 10.5 / INT8_MAX + 1e-9  # a tie, just above the half step
    x[0, 2] = 20.2 / INT8_MAX  # far from any half step
    artifact = x.numpy().astype(np.float32).copy()
    artifact[0, 1] = np.float32(10.4999 / INT8_MAX)  # the artifact rounds the tie down
    artifact[0, 2] = np.float32(20.7 / INT8_MAX)  # and this one up: no tie, a real difference
    seen = {}

    def keep_input(_module: nn.Module, args: tuple, _output: torch.Tensor) -> None:
        seen["input"] = args[0]

    model.first.register_forward_hook(keep_input)
    with forced_roundings({"first.weight": artifact}, tie_steps=1e-3) as roundings:
        model(x)
    assert (roundings.values, roundings.adopted, roundings.disagreements) == (64, 1, 1)
    steps = seen["input"][0, :3] * INT8_MAX
    assert torch.allclose(steps, torch.tensor([127.0, 10.0, 20.0], dtype=torch.float64))
