"""compressed-tensors ``pack-quantized``: int4 or int8 values packed densely into int32 words (``weight_packed``
``[out, ceil(in * bits / 32)]``, value ``i`` of a row at bits ``i*bits`` onwards, stored as ``q + 2**(bits-1)``),
``weight_scale`` per group ``[out, in/group]``, channel ``[out, 1]`` or tensor, ``weight_zero_point`` when asymmetric
(packed the same way along the output axis: ``[ceil(out * bits / 32), groups]``; a tensor zero point unpacked) and
``weight_shape`` (the logical ``[out, in]``). The float weight is ``(q - zero_point) * scale``
(compressed-tensors 0.20.0 ``compressors/pack_quantized``)."""

from __future__ import annotations

import torch

from attnres_export.models.store.quantized.base import (
    Blocked,
    Layout,
    QuantizedTensor,
    ceil_div,
    check_dtype,
    check_logical_shape,
    check_shape,
    finite_scale,
    refuse,
)
from attnres_export.models.store.tensors import StoredTensor

BITS = (4, 8)
SCALE_TYPES = (torch.float32, torch.bfloat16, torch.float16)
PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")


def format_name(bits: int) -> str:
    return f"int{bits}-pack-quantized"


def recognise(parts: dict[str, StoredTensor]) -> bool:
    return "weight_packed" in parts and parts["weight_packed"].dtype == torch.int32


def unpack(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The signed values of int32 ``words`` ``[rows, w]``: ``count`` per row, ``32 / bits`` per word, lowest bits
    first, each stored with the offset ``2**(bits - 1)``."""
    per_word = 32 // bits
    shifts = torch.arange(per_word, dtype=torch.int32) * bits
    fields = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # arithmetic shift; the mask drops the sign bits
    return (fields.reshape(words.shape[0], -1)[:, :count] - (1 << (bits - 1))).to(torch.int8)


def check(parts: dict[str, StoredTensor], weights: dict, where: str) -> tuple[torch.Size, int]:
    """``(logical shape, bits)`` from the headers (and the 2-value ``weight_shape`` when the scales cannot tell the
    columns); each inconsistency refused in one line."""
    packed, scale = parts["weight_packed"], parts.get("weight_scale")
    if scale is None:
        raise refuse(where, "weight_packed has no weight_scale")
    bits = int(weights.get("num_bits", 0))
    if bits not in BITS or weights.get("type", "int") != "int":
        raise refuse(where, f"pack-quantized {weights.get('type')} {bits}-bit weights are not read (int4 and int8)")
    check_dtype(where, "weight_packed", packed, (torch.int32,))
    check_dtype(where, "weight_scale", scale, SCALE_TYPES)
    if packed.dim() != 2:
        raise refuse(where, f"weight_packed has {packed.dim()} dimensions, expected 2")
    out = packed.shape[0]
    strategy = str(weights.get("strategy") or "tensor")
    if "weight_shape" in parts:
        shape_part = parts["weight_shape"]
        check_shape(where, "weight_shape", shape_part, [2], "the logical [out, in]")
        columns = int(shape_part.read()[1])  # 2 integers: read now, the scales alone cannot tell the columns
    elif strategy == "group":
        columns = scale.shape[-1] * int(weights.get("group_size") or 0)
    else:
        raise refuse(where, f"{strategy} pack-quantized weight without weight_shape: its column count is unknown")
    check_shape(where, "weight_packed", packed, [out, ceil_div(columns * bits, 32)], f"{columns} {bits}-bit columns")
    if strategy == "group":
        group = int(weights.get("group_size") or 0)
        if group <= 0 or columns % group:
            raise refuse(where, f"group_size {group} does not divide the {columns} columns")
        groups = columns // group
        check_shape(where, "weight_scale", scale, [out, groups], f"one scale per {group}-column group")
    elif strategy == "channel":
        groups = 1
        check_shape(where, "weight_scale", scale, [out, 1], "one scale per output channel")
    elif strategy == "tensor":
        groups = 0
        if scale.numel() != 1:
            raise refuse(where, f"weight_scale has shape {list(scale.shape)}, a tensor strategy stores one value")
    else:
        raise refuse(where, f"pack-quantized strategy {strategy!r} is not read (group, channel or tensor)")
    zero = parts.get("weight_zero_point")
    if weights.get("symmetric", True):
        if zero is not None:
            raise refuse(where, "weight_zero_point given for a symmetric scheme")
    elif zero is None:
        raise refuse(where, "an asymmetric scheme needs weight_zero_point")
    elif groups:
        check_dtype(where, "weight_zero_point", zero, (torch.int32,))
        check_shape(where, "weight_zero_point", zero, [ceil_div(out * bits, 32), groups],
                    f"{bits}-bit zero points packed along the {out} output channels")
    elif zero.numel() != 1:
        raise refuse(where, f"weight_zero_point has shape {list(zero.shape)}, a tensor strategy stores one value")
    return torch.Size([out, columns]), bits


class PackedIntWeight(QuantizedTensor):
    def layout(self) -> Layout:
        strategy = str(self.scheme.get("strategy") or "tensor")
        size = int(self.scheme["group_size"]) if strategy == "group" else self.shape[1]
        return Layout(size, self.scheme["num_bits"], torch.int8, "weight_zero_point" in self.parts,
                      self.parts["weight_scale"].dtype == torch.float16)

    def blocked_from(self, parts: dict[str, torch.Tensor]) -> Blocked:
        bits, strategy = self.scheme["num_bits"], str(self.scheme.get("strategy") or "tensor")
        out, columns = self.shape
        if "weight_shape" in parts:
            check_logical_shape(self.where, parts["weight_shape"], self.shape)
        values = unpack(parts["weight_packed"], bits, columns)
        scale = finite_scale(self.where, "weight_scale", parts["weight_scale"])
        zero = parts.get("weight_zero_point")
        if strategy == "tensor":
            scale = scale.reshape(1, 1).expand(out, 1).contiguous()
            zero = None if zero is None else zero.reshape(1, 1).expand(out, 1).to(torch.int8).contiguous()
        elif zero is not None:
            zero = unpack(zero.t().contiguous(), bits, out).t().contiguous()
        size = int(self.scheme["group_size"]) if strategy == "group" else columns
        return Blocked(values, scale, zero, size, bits)

    def dequantize(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.blocked_from(parts).dequantize()
