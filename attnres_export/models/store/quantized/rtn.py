"""Round-to-nearest (RTN) quantization of a float weight as it is read, for ``attnres-export --quantize int4|int8``.

Weights only (activations stay float), symmetric, one scale per block of ``block_size`` consecutive input (last-axis)
columns: ``scale = absmax / qmax`` (qmax 7 for int4, 127 for int8) and ``q = clamp(round(w / scale))``, rounding half
to even, in -8..7 (int4) or -127..127 (int8). RTN needs no calibration data and no model run, so it quantizes one
tensor at a time as the export streams it; the last block of a row may be partial (its scale is taken over the
columns it has).

Each scale is rounded to the nearest float16 value (kept in a float32 tensor, clamped to float16's normal range
[2**-14, 65504]; an all-zero block gets 2**-14 and values 0) before the values are computed from it, because the
ONNX file stores the scales as float16 (MatMulNBits' scales take the activation type): the values are then the
nearest integers to the scale the graph really multiplies by, and the stored scales lose nothing. int4 at block 32
is 0.5625 bytes per parameter (half a byte plus two bytes per 32 columns).

ONNX Runtime's ``MatMulNBitsQuantizer`` (``onnxruntime.quantization.matmul_nbits_quantizer``) was not used: it
quantizes a whole ONNX model held in memory, while the export streams one tensor at a time from the checkpoint and
never holds the float model's graph with its weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnres_export.models.store.quantized.base import Blocked, Layout, QuantizedTensor, ceil_div, numel, refuse
from attnres_export.models.store.tensors import StoredTensor

BITS = (4, 8)
BLOCK_SIZES = (16, 32, 64, 128, 256)
"""Powers of two from 16 to 256: the block sizes ONNX Runtime's MatMulNBits accepts."""
SCALE_MIN = 2.0 ** -14
"""The smallest normal float16 value: the scale of an all-zero block, and the floor of every scale."""
SCALE_MAX = 65504.0
"""The largest float16 value."""
SCALE_BYTES = 2
"""A scale's bytes in the ONNX file (float16)."""


def format_name(bits: int) -> str:
    return f"int{bits}-rtn"


def qrange(bits: int) -> tuple[int, int]:
    """The values a ``bits``-bit weight keeps: -8..7 for int4, -127..127 for int8 (symmetric, -128 unused)."""
    qmax = (1 << (bits - 1)) - 1
    return (-qmax - 1 if bits == 4 else -qmax), qmax


def float16_nearest(value: torch.Tensor) -> torch.Tensor:
    """``value`` (float64, positive) clamped to [2**-14, 65504] and rounded to the nearest float16 value (half to
    even), as float64. Rounded here in one step: torch casts float64 to float16 through float32, two roundings."""
    value = value.clamp(SCALE_MIN, SCALE_MAX)
    _, exponent = torch.frexp(value)  # value = m * 2**exponent, 0.5 <= m < 1; float16 keeps 11 significant bits
    quantum = torch.ldexp(torch.ones_like(value), exponent - 11)
    return torch.round(value / quantum) * quantum  # exact: a power-of-two division, then an integer times it


def quantize(weight: torch.Tensor, bits: int, block_size: int) -> Blocked:
    """``weight`` (float32 ``[..., out, in]``) quantized to RTN blocks."""
    qmin, qmax = qrange(bits)
    columns = weight.shape[-1]
    blocks = ceil_div(columns, block_size)
    padded = weight if columns == blocks * block_size else F.pad(weight, (0, blocks * block_size - columns))
    grouped = padded.reshape(*weight.shape[:-1], blocks, block_size)
    absmax = grouped.abs().amax(dim=-1)
    scales = float16_nearest(absmax.to(torch.float64) / qmax).to(torch.float32)
    values = grouped / scales.unsqueeze(-1)  # a new tensor: the source's read may be a read-only mapping
    values = values.round_().clamp_(qmin, qmax).to(torch.int8)
    values = values.reshape(*weight.shape[:-1], blocks * block_size)[..., :columns].contiguous()
    return Blocked(values, scales, None, block_size, bits)


class RTNWeight(QuantizedTensor):
    """A float weight (``source``, dense ``[out, in]`` or stacked ``[..., out, in]``) quantized RTN when it is read:
    ``blocked()`` gives the int8 values and float16-exact float32 scales, ``read()`` their float32 product. Nothing
    is cached: each call reads the source and quantizes it again."""

    def __init__(self, source: StoredTensor, bits: int, block_size: int, where: str) -> None:
        strategy = "channel" if block_size >= source.shape[-1] else "group"
        scheme = {"num_bits": bits, "block_size": block_size, "symmetric": True, "strategy": strategy,
                  "observer": "minmax (absmax)"}
        super().__init__(source.shape, format_name(bits), {"weight": source}, scheme, where)
        self.source = source
        self.bits = bits
        self.block_size = block_size

    def layout(self) -> Layout:
        """int8 values in the ``bits`` range, no zero points, float16-exact scales."""
        return Layout(self.block_size, self.bits, torch.int8, False, True)

    def blocked_from(self, parts: dict[str, torch.Tensor]) -> Blocked:
        return quantize(parts["weight"].to(torch.float32), self.bits, self.block_size)

    def dequantize(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.blocked_from(parts).dequantize()

    @property
    def stored_nbytes(self) -> int:
        """Bytes in an ONNX file: the values at ``bits`` each, packed densely, and a float16 scale per block."""
        values = ceil_div(numel(self.shape) * self.bits, 8)
        scales = numel(self.shape[:-1]) * ceil_div(self.shape[-1], self.block_size)
        return values + scales * SCALE_BYTES

    def __repr__(self) -> str:
        return f"RTNWeight({self.where}, {self.format}, block {self.block_size}, {list(self.shape)})"


def rtn_quantized(source: StoredTensor, bits: int, block_size: int | None, where: str) -> RTNWeight:
    """``source`` as an ``RTNWeight`` (``block_size`` None: one scale per row, per channel); refuses in one line bits
    other than 4 and 8, a block size outside MatMulNBits' powers of two 16..256, and a source that is not a
    floating-point matrix (or stack of them)."""
    if bits not in BITS:
        raise refuse(where, f"--quantize int{bits} is not offered: round-to-nearest quantizes to int4 or int8")
    if block_size is not None and block_size not in BLOCK_SIZES:
        raise refuse(where, f"--quantize-block-size {block_size} is not a power of two from 16 to 256 (the block "
                            "sizes ONNX Runtime's MatMulNBits takes)")
    if not source.dtype.is_floating_point:
        raise refuse(where, f"{source.where} is {str(source.dtype).removeprefix('torch.')}, not a float weight; "
                            "only float weights are quantized")
    if source.dim() < 2:
        raise refuse(where, f"{source.where} has shape {list(source.shape)}; only weights of 2 or more dimensions "
                            "([..., out, in]) are quantized")
    return RTNWeight(source, bits, source.shape[-1] if block_size is None else block_size, where)
