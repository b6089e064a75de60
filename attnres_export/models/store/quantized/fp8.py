"""FP8 (float8_e4m3fn) weights with float scales.

* ``fp8-block``: DeepSeek-V3 / Qwen3 FP8 (``quant_method: fp8``, ``weight_block_size [b0, b1]``): ``weight``
  float8_e4m3fn ``[out, in]`` and ``weight_scale_inv`` ``[ceil(out/b0), ceil(in/b1)]``; the float weight is ``weight
  * weight_scale_inv`` broadcast per block, the last row and column blocks partial (DeepSeek-V3
  ``inference/kernel.py: weight_dequant``, 128x128 blocks).
* ``float-quantized``: compressed-tensors FP8 weights (``weight`` float8_e4m3fn and ``weight_scale`` per tensor,
  channel, group or block, by the config's ``strategy``): ``weight * weight_scale`` (compressed-tensors 0.20.0
  ``compressors/quantized_compressors``).
* ``int8-quantized``: compressed-tensors ``naive-quantized`` / ``int-quantized`` int8 ``weight`` with
  ``weight_scale`` (and ``weight_zero_point`` when asymmetric): ``(weight - zero_point) * weight_scale``."""

from __future__ import annotations

import torch

from attnres_export.models.store.quantized.base import (
    Blocked,
    Layout,
    QuantizedTensor,
    ceil_div,
    check_dtype,
    check_shape,
    finite_scale,
    refuse,
)
from attnres_export.models.store.tensors import StoredTensor

BLOCK_FORMAT = "fp8-block"
FLOAT_FORMAT = "float-quantized"
INT8_FORMAT = "int8-quantized"
FP8_TYPES = (torch.float8_e4m3fn,)
SCALE_TYPES = (torch.float32, torch.bfloat16, torch.float16)


def recognise_block(parts: dict[str, StoredTensor]) -> bool:
    return "weight" in parts and "weight_scale_inv" in parts


def recognise_scaled(parts: dict[str, StoredTensor]) -> bool:
    return ("weight" in parts and "weight_scale" in parts
            and parts["weight"].dtype in (*FP8_TYPES, torch.float8_e5m2, torch.int8))


def expand_blocks(scale: torch.Tensor, shape: torch.Size, rows: int, columns: int) -> torch.Tensor:
    """``scale`` ``[ceil(out/rows), ceil(in/columns)]`` repeated over its blocks, cut to ``shape``."""
    return scale.repeat_interleave(rows, 0)[:shape[0]].repeat_interleave(columns, 1)[:, :shape[1]]


def check_block(parts: dict[str, StoredTensor], block: list[int], where: str) -> torch.Size:
    weight, scale = parts["weight"], parts["weight_scale_inv"]
    check_dtype(where, "weight", weight, FP8_TYPES)
    check_dtype(where, "weight_scale_inv", scale, SCALE_TYPES)
    if weight.dim() != 2:
        raise refuse(where, f"weight has {weight.dim()} dimensions, expected 2")
    rows, columns = block
    check_shape(where, "weight_scale_inv", scale, [ceil_div(weight.shape[0], rows), ceil_div(weight.shape[1], columns)],
                f"one scale per {rows}x{columns} block of weight {list(weight.shape)}")
    return weight.shape


def dequantize_block(weight: torch.Tensor, scale_inv: torch.Tensor, block: list[int], where: str) -> torch.Tensor:
    scale = finite_scale(where, "weight_scale_inv", scale_inv)
    return weight.to(torch.float32) * expand_blocks(scale, weight.shape, *block)


class FP8BlockWeight(QuantizedTensor):
    def dequantize(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        return dequantize_block(parts["weight"], parts["weight_scale_inv"], self.scheme["weight_block_size"],
                                self.where)

    def layout(self) -> Layout:
        return Layout(self.scheme["weight_block_size"][1], 8, torch.float8_e4m3fn, False,
                      self.parts["weight_scale_inv"].dtype == torch.float16)

    def blocked_from(self, parts: dict[str, torch.Tensor]) -> Blocked:
        """The FP8 values with one scale per row and block of columns (each block's scale repeated over its rows:
        one-axis blocks are what ONNX's blocked DequantizeLinear takes)."""
        rows, columns = self.scheme["weight_block_size"]
        scale = finite_scale(self.where, "weight_scale_inv", parts["weight_scale_inv"])
        return Blocked(parts["weight"], scale.repeat_interleave(rows, 0)[:self.shape[0]].contiguous(), None, columns, 8)


def scale_shape(strategy: str, weights: dict, shape: torch.Size, where: str) -> list[int] | None:
    """The ``weight_scale`` shape a compressed-tensors strategy stores (``None``: one value, any shape)."""
    out, columns = shape
    if strategy == "tensor":
        return None
    if strategy == "channel":
        return [out, 1]
    if strategy == "group":
        group = int(weights.get("group_size") or 0)
        if group <= 0 or columns % group:
            raise refuse(where, f"group_size {group} does not divide the {columns} columns")
        return [out, columns // group]
    if strategy == "block":
        rows, cols = weights.get("block_structure") or [0, 0]
        if rows <= 0 or cols <= 0:
            raise refuse(where, f"block_structure {weights.get('block_structure')} is not two positive sizes")
        return [ceil_div(out, rows), ceil_div(columns, cols)]
    raise refuse(where, f"weights strategy {strategy!r} is not read (tensor, channel, group or block)")


def per_element(scale: torch.Tensor, strategy: str, weights: dict, shape: torch.Size) -> torch.Tensor:
    """A tensor, channel, group or block scale broadcast to ``shape``."""
    if strategy == "tensor":
        return scale.reshape(1, 1).expand(shape)
    if strategy == "channel":
        return scale.reshape(-1, 1).expand(shape)
    if strategy == "group":
        return scale.repeat_interleave(int(weights["group_size"]), 1)
    return expand_blocks(scale, shape, *weights["block_structure"])


def check_scaled(parts: dict[str, StoredTensor], weights: dict, where: str) -> tuple[str, torch.Size]:
    """``(format, logical shape)`` of a compressed-tensors FP8 or int8 weight with ``weight_scale``."""
    weight, scale = parts["weight"], parts["weight_scale"]
    integer = weight.dtype == torch.int8
    check_dtype(where, "weight", weight, (torch.int8,) if integer else FP8_TYPES)
    check_dtype(where, "weight_scale", scale, SCALE_TYPES)
    if weights.get("num_bits", 8) != 8 or weights.get("type", "int" if integer else "float") != (
            "int" if integer else "float"):
        raise refuse(where, f"weight is {str(weight.dtype).removeprefix('torch.')} but quantization_config weights "
                            f"say {weights.get('type')} {weights.get('num_bits')}-bit")
    if not integer and not weights.get("symmetric", True):
        raise refuse(where, "asymmetric FP8 weights are not a compressed-tensors format")
    if weight.dim() != 2:
        raise refuse(where, f"weight has {weight.dim()} dimensions, expected 2")
    strategy = str(weights.get("strategy") or "tensor")
    wanted = scale_shape(strategy, weights, weight.shape, where)
    if wanted is None:
        if scale.numel() != 1:
            raise refuse(where, f"weight_scale has shape {list(scale.shape)}, a tensor strategy stores one value")
    else:
        check_shape(where, "weight_scale", scale, wanted, f"{strategy} strategy")
    if "weight_zero_point" in parts:
        if not integer or weights.get("symmetric", True):
            raise refuse(where, "weight_zero_point given for a symmetric scheme")
        check_shape(where, "weight_zero_point", parts["weight_zero_point"], list(scale.shape), "one per scale")
    elif integer and not weights.get("symmetric", True):
        raise refuse(where, "asymmetric int8 weights need weight_zero_point")
    return (INT8_FORMAT if integer else FLOAT_FORMAT), weight.shape


class ScaledWeight(QuantizedTensor):
    def dequantize(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        weights, strategy = self.scheme, str(self.scheme.get("strategy") or "tensor")
        scale = finite_scale(self.where, "weight_scale", parts["weight_scale"])
        values = parts["weight"].to(torch.float32)
        if "weight_zero_point" in parts:
            values = values - per_element(parts["weight_zero_point"].to(torch.float32), strategy, weights, self.shape)
        return values * per_element(scale, strategy, weights, self.shape)

    def layout(self) -> Layout:
        values = torch.int8 if self.format == INT8_FORMAT else torch.float8_e4m3fn
        return Layout(self._block_size(), 8, values, "weight_zero_point" in self.parts,
                      self.parts["weight_scale"].dtype == torch.float16)

    def _block_size(self) -> int:
        strategy = str(self.scheme.get("strategy") or "tensor")
        if strategy == "group":
            return int(self.scheme["group_size"])
        if strategy == "block":
            return int(self.scheme["block_structure"][1])
        return self.shape[1]

    def blocked_from(self, parts: dict[str, torch.Tensor]) -> Blocked:
        """One scale per row and block of columns: a tensor or channel scale is one block per row, a block scale is
        repeated over its rows."""
        strategy = str(self.scheme.get("strategy") or "tensor")
        out = self.shape[0]
        scale = finite_scale(self.where, "weight_scale", parts["weight_scale"])
        zero = parts.get("weight_zero_point")
        if strategy in ("tensor", "channel"):
            scale = scale.reshape(-1, 1).expand(out, 1).contiguous()
            zero = None if zero is None else zero.reshape(-1, 1).expand(out, 1).contiguous()
        elif strategy == "block":
            rows = int(self.scheme["block_structure"][0])
            scale = scale.repeat_interleave(rows, 0)[:out].contiguous()
            zero = None if zero is None else zero.repeat_interleave(rows, 0)[:out].contiguous()
        zero = None if zero is None else zero.to(torch.int8)
        return Blocked(parts["weight"], scale, zero, self._block_size(), 8)
