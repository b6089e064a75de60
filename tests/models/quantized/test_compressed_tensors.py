"""Our readers against compressed-tensors' own compressors (random float weights compressed into each format) and
decompressors (the reference): equal bit for bit in the decompressor's type."""

from __future__ import annotations

import warnings

import pytest
import torch

from attnres_export.models.store.quantized import QuantizedTensor, quantized_view
from attnres_export.models.store.quantized.mxfp4 import to_int8

from .helpers import prefixed, stored

ct = pytest.importorskip("compressed_tensors")
warnings.filterwarnings("ignore", module="compressed_tensors")
from compressed_tensors.compressors import BaseCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization.utils.helpers import (  # noqa: E402
    calculate_qparams,
    maybe_pad_tensor_for_block_quant,
)

PREFIX = "model.layers.0.mlp.experts.3.w1"


def qparams(weight: torch.Tensor, args: QuantizationArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and zero points of ``weight`` for ``args`` (min/max per tensor, channel, group or block)."""
    if args.strategy == "group":
        groups = weight.unflatten(-1, (weight.shape[-1] // args.group_size, args.group_size))
        return calculate_qparams(groups.amin(-1), groups.amax(-1), args)
    if args.strategy == "channel":
        return calculate_qparams(weight.amin(-1, keepdim=True), weight.amax(-1, keepdim=True), args)
    if args.strategy == "block":
        rows, cols = args.block_structure
        padded = maybe_pad_tensor_for_block_quant(weight, (rows, cols))
        blocks = padded.reshape(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols).transpose(1, 2)
        return calculate_qparams(blocks.amin((-1, -2)), blocks.amax((-1, -2)), args)
    return calculate_qparams(weight.amin(), weight.amax(), args)


def compressed(fmt: str, args: QuantizationArgs, weight: torch.Tensor) -> tuple[dict, torch.Tensor, dict]:
    """``(compressed parts, compressed-tensors' decompressed weight, the config)``."""
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    scale, zero = qparams(weight, args)
    parts = {"weight": weight, "weight_scale": scale, "weight_zero_point": zero}
    compressor = BaseCompressor.get_value_from_registry(fmt)
    packed = compressor.compress(parts, scheme)
    reference = compressor.decompress(dict(packed), scheme)["weight"]
    config = {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
              "config_groups": {"group_0": {"targets": ["Linear"],
                                            "weights": args.model_dump(mode="json", exclude_none=True),
                                            "input_activations": None}},
              "ignore": ["lm_head"]}
    return packed, reference, config


def read_ours(packed: dict, config: dict) -> QuantizedTensor:
    view = quantized_view(stored(prefixed(PREFIX, packed)), config, "memory")
    assert list(view) == [f"{PREFIX}.weight"]
    return view[f"{PREFIX}.weight"]


def assert_equal_in(ours: torch.Tensor, reference: torch.Tensor) -> None:
    assert ours.dtype == torch.float32
    assert torch.equal(ours.to(reference.dtype), reference)


MXFP4_SHAPES = [(1, 32), (5, 64), (33, 96), (64, 3584)]


@pytest.mark.parametrize("shape", MXFP4_SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mxfp4_equals_compressed_tensors(shape, dtype):
    torch.manual_seed(sum(shape))
    weight = (torch.randn(shape) * torch.logspace(-6, 2, shape[0]).unsqueeze(1)).to(dtype)
    args = QuantizationArgs(num_bits=4, type="float", strategy="group", group_size=32, symmetric=True,
                            scale_dtype=torch.uint8)
    packed, reference, config = compressed("mxfp4-pack-quantized", args, weight)
    ours = read_ours(packed, config)
    assert ours.format == "mxfp4-pack-quantized"
    assert list(ours.shape) == list(shape) and ours.dtype == torch.float32
    assert set(ours.parts) == {"weight_packed", "weight_scale"}
    values = ours.read()
    assert_equal_in(values, reference)
    # bfloat16 holds every MXFP4 value exactly, so compressed-tensors' bfloat16 result is our float32 one
    assert torch.equal(values, reference.float())
    # the int8 form is exact: int8 values in -12..12 times 2**(e - 128) per 32-block
    blocked = ours.blocked()
    assert blocked.values.dtype == torch.int8 and blocked.block_size == 32 and blocked.zero_points is None
    assert int(blocked.values.abs().max()) <= 12
    assert torch.equal(blocked.dequantize(), reference.float())


def test_mxfp4_int8_conversion_is_exact_over_every_code_and_exponent():
    """Every byte (both nibbles, all 16 codes) against every E8M0 exponent 0..254, against E2M1 * 2**(e - 127)
    computed independently in float64."""
    codes = torch.arange(256, dtype=torch.uint8).repeat(255, 1)  # row e: all 256 bytes
    packed = torch.cat([codes, codes], dim=1)  # [255, 512] -> 1024 values, 32 blocks a row
    scale = torch.arange(255, dtype=torch.uint8).unsqueeze(1).repeat(1, 32)
    blocked = to_int8(packed, scale, "memory")
    magnitude = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    nibbles = torch.stack((packed & 15, packed >> 4), -1).reshape(255, -1).long()
    e2m1 = magnitude[nibbles & 7] * torch.where(nibbles >= 8, -1.0, 1.0)
    exact = e2m1 * torch.exp2(torch.arange(255, dtype=torch.float64) - 127).unsqueeze(1)
    ours = blocked.values.double() * blocked.scales.double().repeat_interleave(32, 1)
    assert torch.equal(ours, exact)
    assert torch.equal(blocked.values.double() * 0.5, e2m1)
    fits = exact.abs() <= torch.finfo(torch.float32).max
    assert torch.equal(blocked.dequantize().double()[fits], exact[fits])


PACK_CASES = [
    # bits, strategy, group, symmetric, shape
    (4, "group", 16, True, (19, 48)),
    (4, "group", 32, False, (33, 96)),
    (4, "group", 128, False, (64, 256)),
    (4, "channel", None, True, (19, 45)),
    (4, "channel", None, False, (19, 45)),
    (4, "tensor", None, False, (9, 37)),
    (8, "group", 16, True, (7, 48)),
    (8, "group", 16, False, (21, 80)),
    (8, "channel", None, True, (7, 45)),
    (8, "channel", None, False, (13, 45)),
    (8, "tensor", None, True, (5, 3)),
]


@pytest.mark.parametrize(("bits", "strategy", "group", "symmetric", "shape"), PACK_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_pack_quantized_equals_compressed_tensors(bits, strategy, group, symmetric, shape, dtype):
    torch.manual_seed(bits * 1000 + shape[0] * 7 + shape[1])
    weight = (torch.randn(shape) + (0.0 if symmetric else 0.7)).to(dtype)
    args = QuantizationArgs(num_bits=bits, type="int", strategy=strategy, group_size=group, symmetric=symmetric)
    packed, reference, config = compressed("pack-quantized", args, weight)
    ours = read_ours(packed, config)
    assert ours.format == f"int{bits}-pack-quantized" and list(ours.shape) == list(shape)
    assert_equal_in(ours.read(), reference)
    blocked = ours.blocked()
    assert blocked.bits == bits and (blocked.zero_points is None) == symmetric
    assert blocked.block_size == (group or shape[1])
    assert torch.equal(blocked.dequantize().to(reference.dtype), reference)
    assert int(blocked.values.min()) >= -(1 << (bits - 1)) and int(blocked.values.max()) < (1 << (bits - 1))


FLOAT_CASES = [
    ("tensor", {}, (7, 45)),
    ("channel", {}, (19, 45)),
    ("group", {"group_size": 16}, (9, 48)),
    ("block", {"block_structure": [16, 16]}, (37, 45)),
    ("block", {"block_structure": [128, 128]}, (300, 200)),
]


@pytest.mark.parametrize(("strategy", "extra", "shape"), FLOAT_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_float_quantized_equals_compressed_tensors(strategy, extra, shape, dtype):
    torch.manual_seed(shape[0] + shape[1])
    weight = torch.randn(shape).to(dtype)
    args = QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True, **extra)
    packed, reference, config = compressed("float-quantized", args, weight)
    ours = read_ours(packed, config)
    assert ours.format == "float-quantized" and list(ours.shape) == list(shape)
    assert_equal_in(ours.read(), reference)


@pytest.mark.parametrize(("strategy", "symmetric"), [("channel", True), ("channel", False), ("group", False)])
def test_naive_int8_equals_compressed_tensors(strategy, symmetric):
    torch.manual_seed(3)
    weight = torch.randn(11, 48, dtype=torch.bfloat16) + 0.5
    args = QuantizationArgs(num_bits=8, type="int", strategy=strategy, symmetric=symmetric,
                            group_size=16 if strategy == "group" else None)
    packed, reference, config = compressed("naive-quantized", args, weight)
    ours = read_ours(packed, config)
    assert ours.format == "int8-quantized"
    assert_equal_in(ours.read(), reference)
    assert torch.equal(ours.blocked().dequantize().to(reference.dtype), reference)


def test_experts_stack_keeps_the_blocks():
    """Experts stacked and gate/up joined (as the MoE readers do) stay quantized, and read as the joined
    references."""
    args = QuantizationArgs(num_bits=4, type="float", strategy="group", group_size=32, symmetric=True,
                            scale_dtype=torch.uint8)
    torch.manual_seed(0)
    parts, references, config = {}, [], None
    for expert in range(3):
        for projection in ("w1", "w3"):
            packed, reference, config = compressed("mxfp4-pack-quantized", args, torch.randn(6, 64))
            parts |= prefixed(f"experts.{expert}.{projection}", packed)
            references.append(reference)
    view = quantized_view(stored(parts), config, "memory")
    gate = torch.stack([view[f"experts.{e}.w1.weight"] for e in range(3)])
    up = torch.stack([view[f"experts.{e}.w3.weight"] for e in range(3)])
    gate_up = torch.cat([gate, up], dim=1)
    assert isinstance(gate_up, QuantizedTensor) and gate_up.format == "mxfp4-pack-quantized"
    assert list(gate_up.shape) == [3, 12, 64]
    expected = torch.cat([torch.stack(references[0::2]), torch.stack(references[1::2])], dim=1).float()
    assert torch.equal(gate_up.read(), expected)
    assert torch.equal(gate_up.blocked().dequantize(), expected)
    assert list(gate_up.blocked().scales.shape) == [3, 12, 2]
    # a slice no longer has blocks: it reads as dense dequantized values
    part = gate_up[0]
    assert part.format == "dense" and torch.equal(part.read(), expected[0])
