"""Round-to-nearest quantization on read (``RTNWeight``) against a NumPy reimplementation written here from the rule
in docs/quantization.md: float64 absmax per block, the scale ``absmax / qmax`` rounded by ``np.float16`` and clipped
to [2**-14, 65504], values ``np.rint(w / scale)`` clipped to the int4 or int8 range."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnres_export.errors import CheckpointError
from attnres_export.models.store.quantized.base import Layout, QuantizedJoin
from attnres_export.models.store.quantized.rtn import RTNWeight, float16_nearest, rtn_quantized
from attnres_export.models.store.tensors import StoredTensor


def source(t: torch.Tensor, name: str = "w") -> StoredTensor:
    return StoredTensor(t.shape, t.dtype, lambda: t, f"test: {name}")


def reference(weight: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(values int8, scales float64) of ``weight`` (float64 ``[..., out, in]``), block by block along the last axis."""
    qmax = 2 ** (bits - 1) - 1
    qmin = -8 if bits == 4 else -qmax
    columns = weight.shape[-1]
    blocks = -(-columns // block)
    values = np.empty(weight.shape, dtype=np.int8)
    scales = np.empty((*weight.shape[:-1], blocks), dtype=np.float64)
    for b in range(blocks):
        cols = weight[..., b * block:(b + 1) * block]
        absmax = np.abs(cols).max(axis=-1)
        with np.errstate(over="ignore"):  # beyond 65504 float16 gives inf, clipped to 65504 below
            scale = np.clip((absmax / qmax).astype(np.float16).astype(np.float64), 2.0 ** -14, 65504.0)
        scales[..., b] = scale
        values[..., b * block:(b + 1) * block] = np.clip(np.rint(cols / scale[..., None]), qmin, qmax)
    return values, scales


def random_weight(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Normal values with each row scaled by one of 1e-3, 1, 30 (tiny, plain and large blocks)."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(shape, generator=generator, dtype=torch.float64)
    magnitudes = torch.tensor([1e-3, 1.0, 30.0], dtype=torch.float64)
    rows = magnitudes[torch.randint(0, 3, (*shape[:-1], 1), generator=generator)]
    return (weight * rows).to(dtype)


SHAPES = [(8, 64), (5, 100), (1, 48), (3, 6, 40), (4, 7)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [16, 32, 128])
def test_rtn_equals_numpy_reference_exactly(shape, dtype, bits, block):
    weight = random_weight(shape, dtype, seed=sum(shape) * 1000 + bits * 100 + block)
    ours = rtn_quantized(source(weight), bits, block, "test: w")
    blocked = ours.blocked()
    values, scales = reference(weight.to(torch.float64).numpy(), bits, block)
    assert blocked.values.dtype == torch.int8 and blocked.scales.dtype == torch.float32
    assert list(blocked.scales.shape) == [*shape[:-1], math.ceil(shape[-1] / block)]
    assert blocked.zero_points is None and blocked.block_size == block and blocked.bits == bits
    assert np.array_equal(blocked.values.numpy(), values)
    assert np.array_equal(blocked.scales.numpy().astype(np.float64), scales)
    dequantized = values.astype(np.float64) * np.repeat(scales, block, axis=-1)[..., :shape[-1]]
    read = ours.read()
    assert read.dtype == torch.float32 and list(read.shape) == list(shape)
    assert np.array_equal(read.numpy().astype(np.float64), dequantized)  # exact: <= 8-bit value x 11-bit scale


@pytest.mark.parametrize("bits", [4, 8])
def test_rtn_scales_round_trip_float16_exactly(bits):
    weight = random_weight((16, 96), torch.float32, seed=bits)
    weight[0, :32] = 0  # an all-zero block
    weight[1, :32] *= 1e-9  # a block whose absmax / qmax is below float16's normal range
    weight[2, :32] *= 1e6  # a block whose absmax / qmax is above 65504
    scales = rtn_quantized(source(weight), bits, 32, "test: w").blocked().scales
    assert torch.equal(scales.to(torch.float16).to(torch.float32), scales)
    assert float(scales.min()) >= 2.0 ** -14 and float(scales.max()) <= 65504.0
    assert float(scales[0, 0]) == 2.0 ** -14 and float(scales[1, 0]) == 2.0 ** -14 and float(scales[2, 0]) == 65504.0


def test_rtn_scale_is_rounded_to_float16_once_not_through_float32():
    # 1 + 2**-11 + 2**-30 is just above the float16 midpoint 1 + 2**-11: nearest float16 is 1 + 2**-10, while
    # float64 -> float32 -> float16 (torch's cast) lands on the midpoint and rounds to even, 1.0
    value = torch.tensor([1 + 2.0 ** -11 + 2.0 ** -30, 1 + 2.0 ** -11, 3 * 2.0 ** -11], dtype=torch.float64)
    expected = np.array([np.float16(v) for v in value.tolist()], dtype=np.float64)
    assert np.array_equal(float16_nearest(value).numpy(), expected)
    assert float(float16_nearest(value)[0]) == 1 + 2.0 ** -10


@pytest.mark.parametrize("bits", [4, 8])
def test_rtn_zero_block_gets_smallest_scale_and_zero_values(bits):
    weight = torch.zeros(2, 40)
    weight[1, 32:] = 1.0
    blocked = rtn_quantized(source(weight), bits, 32, "test: w").blocked()
    assert blocked.scales[0].tolist() == [2.0 ** -14, 2.0 ** -14] and blocked.scales[1, 0] == 2.0 ** -14
    assert int(blocked.values[0].abs().sum()) == 0 and int(blocked.values[1, :32].abs().sum()) == 0


def test_rtn_rounds_ties_to_even():
    # absmax 7 gives scale 1 (int4): w / scale is w itself
    row = torch.tensor([7.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5] + [0.0] * 8)
    blocked = rtn_quantized(source(row.reshape(1, 16)), 4, 16, "test: w").blocked()
    assert float(blocked.scales[0, 0]) == 1.0
    assert blocked.values[0, :8].tolist() == [7, 0, 2, 2, 0, -2, -2, 4]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [16, 32, 128])
def test_rtn_error_per_element_is_at_most_half_a_scale(shape, bits, block):
    weight = random_weight(shape, torch.float32, seed=sum(shape) + bits + block)
    ours = rtn_quantized(source(weight), bits, block, "test: w")
    scales = ours.blocked().scales.to(torch.float64).repeat_interleave(block, dim=-1)[..., :shape[-1]]
    error = (ours.read().to(torch.float64) - weight.to(torch.float64)).abs()
    assert bool((error <= scales / 2).all())


def test_rtn_weight_describes_itself():
    weight = random_weight((5, 100), torch.bfloat16, seed=1)
    ours = rtn_quantized(source(weight), 4, 32, "test: w")
    assert isinstance(ours, RTNWeight) and ours.format == "int4-rtn" and ours.dtype == torch.float32
    assert ours.where == "test: w" and list(ours.shape) == [5, 100]
    assert ours.scheme == {"num_bits": 4, "block_size": 32, "symmetric": True, "strategy": "group",
                           "observer": "minmax (absmax)"}
    assert torch.equal(ours.read_parts()["weight"], weight)
    assert ours.stored_nbytes == math.ceil(500 * 4 / 8) + 5 * 4 * 2
    assert rtn_quantized(source(weight), 8, 128, "test: w").stored_nbytes == 500 + 5 * 1 * 2
    assert rtn_quantized(source(weight), 8, 128, "test: w").format == "int8-rtn"
    assert ours.layout() == Layout(32, 4, torch.int8, False, True)
    square = rtn_quantized(source(torch.ones(64, 256)), 4, 32, "test: w")
    assert square.stored_nbytes == 64 * 256 * 0.5625  # int4 at block 32: 0.5625 bytes per parameter


@pytest.mark.parametrize(("t", "bits", "block", "problem"), [
    (torch.ones(4, 32), 3, 32, "--quantize int3 is not offered"),
    (torch.ones(4, 32), 4, 24, "--quantize-block-size 24 is not a power of two from 16 to 256"),
    (torch.ones(4, 32), 8, 512, "--quantize-block-size 512 is not a power of two from 16 to 256"),
    (torch.ones(32), 4, 32, "has shape [32]; only weights of 2 or more dimensions"),
    (torch.ones(4, 32, dtype=torch.int32), 4, 32, "is int32, not a float weight"),
], ids=["bits-3", "block-24", "block-512", "one-dim", "int-source"])
def test_rtn_refusals_are_one_line(t, bits, block, problem):
    with pytest.raises(CheckpointError) as raised:
        rtn_quantized(source(t), bits, block, "model.layers.0.mlp.up_proj.weight")
    message = str(raised.value)
    assert "\n" not in message and message.startswith("model.layers.0.mlp.up_proj.weight: ") and problem in message


@pytest.mark.parametrize("join", [torch.stack, torch.cat])
def test_rtn_join_of_two_weights_is_a_quantized_join_of_their_blocks(join):
    a = rtn_quantized(source(random_weight((6, 40), torch.bfloat16, seed=2), "a"), 4, 16, "test: a")
    b = rtn_quantized(source(random_weight((6, 40), torch.bfloat16, seed=3), "b"), 4, 16, "test: b")
    joined = join([a, b], 0)
    assert isinstance(joined, QuantizedJoin) and joined.format == "int4-rtn"
    assert list(joined.shape) == list(join([torch.empty(6, 40), torch.empty(6, 40)], 0).shape)
    blocked, one, two = joined.blocked(), a.blocked(), b.blocked()
    assert torch.equal(blocked.values, join([one.values, two.values], 0))
    assert torch.equal(blocked.scales, join([one.scales, two.scales], 0))
    assert blocked.zero_points is None and blocked.block_size == 16 and blocked.bits == 4
    assert joined.layout() == Layout(16, 4, torch.int8, False, True)
    assert torch.equal(joined.read(), join([a.read(), b.read()], 0))
    assert joined.stored_nbytes == a.stored_nbytes + b.stored_nbytes


def test_rtn_join_along_the_input_axis_reads_dense():
    a = rtn_quantized(source(random_weight((6, 40), torch.float32, seed=4), "a"), 8, 32, "test: a")
    b = rtn_quantized(source(random_weight((6, 40), torch.float32, seed=5), "b"), 8, 32, "test: b")
    joined = torch.cat([a, b], -1)
    assert not isinstance(joined, QuantizedJoin) and list(joined.shape) == [6, 80]
    assert torch.equal(joined.read(), torch.cat([a.read(), b.read()], -1))


def test_rtn_stacked_weight_equals_each_slice_quantized():
    weight = random_weight((3, 6, 40), torch.float16, seed=6)
    stacked = rtn_quantized(source(weight), 4, 16, "test: w").blocked()
    for i in range(3):
        alone = rtn_quantized(source(weight[i]), 4, 16, "test: w").blocked()
        assert torch.equal(stacked.values[i], alone.values) and torch.equal(stacked.scales[i], alone.scales)
