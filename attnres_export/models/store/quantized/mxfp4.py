"""compressed-tensors ``mxfp4-pack-quantized`` (Kimi K3's routed experts; compressed-tensors 0.20.0
``MXFP4PackedCompressor``, llama.cpp ``conversion/kimi_k3.py``): FP4 E2M1 values two per byte, the low nibble the
even column (``weight_packed`` uint8 ``[out, in/2]``), one E8M0 scale byte per 32 values (``weight_scale`` uint8
``[out, in/32]``, ``2**(e - 127)``, 0xFF is NaN), symmetric, weights only.

Exact int8 form: an E2M1 value times 2 is an integer in {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12}, so a block is exactly
``int8 values * 2**(e - 128)`` (``to_int8``)."""

from __future__ import annotations

import torch

from attnres_export.models.store.quantized.base import (
    Blocked,
    Layout,
    QuantizedTensor,
    check_dtype,
    check_logical_shape,
    check_shape,
    refuse,
)
from attnres_export.models.store.tensors import StoredTensor

FORMAT = "mxfp4-pack-quantized"
GROUP = 32
PARTS = ("weight_packed", "weight_scale")
OPTIONAL = ("weight_shape",)
E8M0_NAN = 0xFF

TWICE_E2M1 = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=torch.int8)
"""Each E2M1 code (sign bit 8, magnitude 0.5 * [0, 1, 2, 3, 4, 6, 8, 12]) times 2."""

SCALE_TYPES = (torch.uint8, torch.float8_e8m0fnu)


def recognise(parts: dict[str, StoredTensor]) -> bool:
    """A weight whose parts are a uint8 ``weight_packed`` and a one-byte ``weight_scale``."""
    return ("weight_packed" in parts and "weight_scale" in parts and parts["weight_packed"].dtype == torch.uint8
            and parts["weight_scale"].dtype in SCALE_TYPES and "weight_global_scale" not in parts)


def check(parts: dict[str, StoredTensor], weights: dict | None, where: str) -> torch.Size:
    """The logical ``[out, in]`` from the headers, each inconsistency refused in one line."""
    packed, scale = parts["weight_packed"], parts["weight_scale"]
    check_dtype(where, "weight_packed", packed, (torch.uint8,))
    check_dtype(where, "weight_scale", scale, SCALE_TYPES)
    if weights is not None:
        wanted = {"num_bits": 4, "type": "float", "group_size": GROUP, "symmetric": True}
        for key, value in wanted.items():
            if key in weights and weights[key] != value:
                raise refuse(where, f"quantization_config weights.{key} is {weights[key]!r}; {FORMAT} has {value!r}")
    if packed.dim() != 2:
        raise refuse(where, f"weight_packed has {packed.dim()} dimensions, expected 2 ([out, in/2])")
    out, columns = packed.shape[0], 2 * packed.shape[1]
    if columns % GROUP:
        raise refuse(where, f"{columns} columns are not a whole number of {GROUP}-value scale groups")
    check_shape(where, "weight_scale", scale, [out, columns // GROUP], f"one E8M0 byte per {GROUP} values")
    return torch.Size([out, columns])


def check_values(scale: torch.Tensor, where: str) -> torch.Tensor:
    """The scale bytes as uint8, refusing the E8M0 NaN byte 0xFF."""
    scale = scale.view(torch.uint8)
    nan = scale == E8M0_NAN
    if bool(nan.any()):
        at = [int(i) for i in nan.nonzero()[0]]
        raise refuse(where, f"weight_scale holds the E8M0 NaN byte 0xFF at {at}; the checkpoint is corrupted")
    return scale


def to_int8(packed: torch.Tensor, scale: torch.Tensor, where: str) -> Blocked:
    """The exact int8 form: values ``2 * E2M1`` in -12..12 ``[out, in]``, float32 scales ``2**(e - 128)``
    ``[out, in/32]`` (``values * scales`` per block equals the MXFP4 weight bit for bit)."""
    scale = check_values(scale, where)
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], -1)  # low nibble first
    values = TWICE_E2M1[codes.long()]
    scales = torch.exp2(scale.to(torch.float64) - 128).to(torch.float32)  # exact: 2**-128 is a float32 subnormal
    return Blocked(values, scales, None, GROUP, 8)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, where: str) -> torch.Tensor:
    """The float32 weight ``E2M1 * 2**(e - 127)`` (exact, as the int8 form)."""
    return to_int8(packed, scale, where).dequantize()


class MXFP4Weight(QuantizedTensor):
    def dequantize(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.blocked_from(parts).dequantize()

    def layout(self) -> Layout:
        return Layout(GROUP, 8, torch.int8, False, False)

    def blocked_from(self, parts: dict[str, torch.Tensor]) -> Blocked:
        if "weight_shape" in parts:
            check_logical_shape(self.where, parts["weight_shape"], self.shape)
        return to_int8(parts["weight_packed"], parts["weight_scale"], self.where)


def pack(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """``weight`` ``[out, in]`` (``in`` a multiple of 32) as MXFP4 parts, as the OCP MX specification v1.0 §6.3
    quantizes: each block's scale ``2**(floor(log2(amax)) - 2)`` (2 is E2M1's largest exponent; an all-zero block
    gets the smallest, 2**-127), the values rounded to the nearest E2M1 (ties to even), beyond ±6 saturated. Writes
    the K3 example's experts as Moonshot publishes them."""
    out, columns = weight.shape
    if columns % GROUP:
        raise ValueError(f"{columns} columns are not a whole number of {GROUP}-value blocks")
    blocks = weight.to(torch.float64).reshape(out, columns // GROUP, GROUP)
    amax = blocks.abs().amax(-1)
    exponent = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(2.0 ** -127))) - 2,
                           torch.full_like(amax, -127.0)).clamp(-127, 127)
    scaled = (blocks / torch.exp2(exponent).unsqueeze(-1)).clamp(-6, 6)
    magnitudes = TWICE_E2M1[:8].to(torch.float64) / 2
    distance = (scaled.abs().unsqueeze(-1) - magnitudes).abs()
    nearest = distance.min(-1, keepdim=True).values
    ties = distance == nearest
    even = ties & (torch.arange(8) % 2 == 0)  # of two nearest codes, the one with an even mantissa bit
    index = torch.where(ties.sum(-1, keepdim=True) > 1, even.float(), ties.float()).argmax(-1)
    codes = (index | ((scaled < 0) & (index > 0)).to(torch.int64) << 3).reshape(out, columns).to(torch.uint8)
    return {"weight_packed": codes[:, 0::2] | (codes[:, 1::2] << 4),
            "weight_scale": (exponent + 127).to(torch.uint8)}
