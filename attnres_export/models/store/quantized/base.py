"""What every quantized format shares: the weight that replaces a layer's parts (``QuantizedTensor``), its blocked
integer form for a graph writer (``Blocked``), joins of such weights (experts stacked), and the one-line refusals.

A ``QuantizedTensor`` is a ``StoredTensor`` named ``<prefix>.weight``: its ``shape`` is the logical float shape
``[out, in]``, its ``dtype`` float32 (``DEQUANTIZED``), its ``format`` the format's name, and ``read()`` dequantizes
the stored parts (``parts``, by their suffix: ``weight_packed``, ``weight_scale``, ...), checking them first."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from attnres_export.errors import CheckpointError
from attnres_export.models.store.tensors import DENSE, StoredTensor

DEQUANTIZED = torch.float32
"""The type a quantized weight reads as. Every format here decodes to an integer (or an FP4/FP8 value) times a
scale; that product is exact in float32 whenever the scale has at most 16 significant bits (E8M0, FP8, float16 and
bfloat16 scales: all of MXFP4, GPTQ, AWQ and the bfloat16-scaled compressed-tensors checkpoints) and rounded once
otherwise (float32 scales, as the formats' own float32 arithmetic does). bfloat16 would round FP8-block and float32
scaled products a second time; a caller wanting bfloat16 asks ``read(torch.bfloat16)`` and gets exactly what
compressed-tensors computes in bfloat16 (one rounding of the exact product)."""


@dataclass(frozen=True)
class Blocked:
    """A weight as integers in blocks along its input (last) axis, for a graph writer that keeps it quantized:
    ``(values - zero_points) * scales`` per block of ``block_size`` columns is the float weight.

    ``values``: int8 ``[..., out, in]`` (float8_e4m3fn for the FP8 formats); ``scales``: float32
    ``[..., out, ceil(in / block_size)]``; ``zero_points``: int8 like ``scales``, or ``None`` (symmetric); ``bits``:
    the range the values keep (4: -8..7 as stored; 8: int8; MXFP4's exact form is bits=8 with values in -12..12)."""

    values: torch.Tensor
    scales: torch.Tensor
    zero_points: torch.Tensor | None
    block_size: int
    bits: int

    def dequantize(self) -> torch.Tensor:
        """The float32 weight these blocks hold (the reference a writer's graph must reproduce)."""
        values = self.values.to(torch.float32)
        if self.zero_points is not None:
            values = values - _per_column(self.zero_points.to(torch.float32), self.block_size, values.shape[-1])
        return values * _per_column(self.scales, self.block_size, values.shape[-1])


@dataclass(frozen=True)
class Layout:
    """What a graph writer declares of a weight's blocks before it reads them: the block size along the input
    axis, the range of the values (``bits``: 4 or 8) and their type (``torch.int8`` for integers,
    ``torch.float8_e4m3fn`` for FP8), whether there are zero points, and whether every scale is a float16 value."""

    block_size: int
    bits: int
    values: torch.dtype
    zero_points: bool
    float16_scales: bool


def _per_column(blocks: torch.Tensor, block_size: int, columns: int) -> torch.Tensor:
    return blocks.repeat_interleave(block_size, dim=-1)[..., :columns]


def refuse(where: str, problem: str) -> CheckpointError:
    """The one-line refusal of a quantized weight's parts."""
    return CheckpointError(f"{where}: {problem}")


def check_dtype(where: str, name: str, part: StoredTensor, allowed: Sequence[torch.dtype]) -> None:
    if part.dtype not in allowed:
        names = " or ".join(str(d).removeprefix("torch.") for d in allowed)
        raise refuse(where, f"{name} is {str(part.dtype).removeprefix('torch.')}, the format stores it as {names}")


def check_shape(where: str, name: str, part: StoredTensor | torch.Tensor, wanted: Sequence[int], why: str) -> None:
    if list(part.shape) != list(wanted):
        raise refuse(where, f"{name} has shape {list(part.shape)}, expected {list(wanted)} ({why})")


def check_logical_shape(where: str, weight_shape: torch.Tensor, shape: Sequence[int]) -> None:
    """A stored ``weight_shape`` must hold the logical shape the packing gives."""
    values = [int(v) for v in weight_shape.flatten().tolist()]
    if values != list(shape):
        raise refuse(where, f"weight_shape holds {values}, but the packed parts give {list(shape)}")


def finite_scale(where: str, name: str, scale: torch.Tensor) -> torch.Tensor:
    """``scale`` as float32 when every value is finite; else one line naming the first bad position."""
    scale = scale.to(torch.float32)
    bad = ~torch.isfinite(scale)
    if bool(bad.any()):
        at = [int(i) for i in bad.nonzero()[0]]
        raise refuse(where, f"{name} holds a non-finite scale ({float(scale[tuple(at)])} at {at}); the checkpoint is "
                            "corrupted")
    return scale


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class QuantizedTensor(StoredTensor):
    """One quantized weight: the logical float ``shape``, ``dtype`` float32, ``format``; ``parts`` (the stored
    tensors by suffix) and ``scheme`` (the format's parameters) for a graph writer; ``read()`` dequantizes and
    ``blocked()`` gives the integer blocks (``None`` where the format has none, e.g. FP8)."""

    def __init__(self, shape: Sequence[int], format: str, parts: dict[str, StoredTensor], scheme: dict,
                 where: str) -> None:
        super().__init__(shape, DEQUANTIZED, self._dequantized, where, format)
        self.parts = parts
        self.scheme = scheme

    def read_parts(self) -> dict[str, torch.Tensor]:
        """The stored parts, read as stored (checked against their headers)."""
        values = {}
        for name, part in self.parts.items():
            value = part.read()
            if value.shape != part.shape or value.dtype != part.dtype:
                raise refuse(self.where, f"{name} changed while it was being read; load it again")
            values[name] = value
        return values

    def dequantize(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def blocked_from(self, parts: dict[str, torch.Tensor]) -> Blocked | None:
        return None

    def blocked(self) -> Blocked | None:
        """The weight as integer blocks (reads and checks the parts), or ``None`` for a format without them."""
        return self.blocked_from(self.read_parts())

    def layout(self) -> Layout | None:
        """The layout ``blocked()`` gives, known before the weight is read (``None`` where there are no blocks)."""
        return None

    def _dequantized(self) -> torch.Tensor:
        return self.dequantize(self.read_parts())

    @property
    def stored_nbytes(self) -> int:
        """Bytes of the stored parts (``nbytes`` is the dequantized float32 size a read returns)."""
        return sum(part.nbytes for part in self.parts.values())

    def __getitem__(self, index) -> StoredTensor:
        return _dense(self)[index]

    def reshape(self, *shape) -> StoredTensor:
        return _dense(self).reshape(*shape)

    def __repr__(self) -> str:
        return f"QuantizedTensor({self.where}, {self.format}, {list(self.shape)})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.stack, torch.cat):
            parts = list(args[0])
            dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
            return joined(parts, dim, func)
        return super().__torch_function__(func, types, args, kwargs)


class QuantizedJoin(QuantizedTensor):
    """``torch.stack`` or ``torch.cat`` of quantized weights of one format (experts stacked, gate and up joined),
    joined along a dimension other than the input one, so its blocks are the members' blocks joined the same way."""

    def __init__(self, members: list[QuantizedTensor], dim: int, join: Callable, shape: torch.Size) -> None:
        first = members[0]
        super().__init__(shape, first.format, {}, first.scheme, f"{first.where} and {len(members) - 1} more")
        self.members = members
        self.dim = dim
        self.join = join

    @property
    def stored_nbytes(self) -> int:
        return sum(member.stored_nbytes for member in self.members)

    def _dequantized(self) -> torch.Tensor:
        return self.join([member._dequantized() for member in self.members], self.dim)

    def layout(self) -> Layout | None:
        """The members' layout; members that differ only in their values' range take the wider one."""
        layouts = [member.layout() for member in self.members]
        if any(layout is None for layout in layouts):
            return None
        first = layouts[0]
        if any((layout.block_size, layout.values, layout.zero_points) !=
               (first.block_size, first.values, first.zero_points) for layout in layouts):
            raise refuse(self.where, "joined weights differ in block size, value type or zero points")
        return Layout(first.block_size, max(layout.bits for layout in layouts), first.values, first.zero_points,
                      all(layout.float16_scales for layout in layouts))

    def blocked(self) -> Blocked | None:
        blocks = [member.blocked() for member in self.members]
        if any(block is None for block in blocks):
            return None
        first = blocks[0]
        if any(b.block_size != first.block_size or (b.zero_points is None) != (first.zero_points is None)
               for b in blocks):
            raise refuse(self.where, "joined weights differ in block size or zero points")
        zero_points = None if first.zero_points is None else self.join([b.zero_points for b in blocks], self.dim)
        return Blocked(self.join([b.values for b in blocks], self.dim), self.join([b.scales for b in blocks], self.dim),
                       zero_points, first.block_size, max(b.bits for b in blocks))


def joined(parts: list, dim: int, join: Callable) -> StoredTensor:
    """A ``QuantizedJoin`` when every part is a quantized weight of one format and the join keeps the input axis
    last; otherwise the dequantized values joined (a plain dense ``StoredTensor``)."""
    shape = join([torch.empty(part.shape, device="meta") for part in parts], dim).shape
    last = len(shape) - 1
    formats = {part.format for part in parts if isinstance(part, QuantizedTensor)}
    if (all(isinstance(part, QuantizedTensor) for part in parts) and len(formats) == 1
            and dim % len(shape) != last):
        return QuantizedJoin(parts, dim, join, shape)
    dense = [_dense(part) if isinstance(part, QuantizedTensor) else part for part in parts]
    return join(dense, dim)


def _dense(tensor: QuantizedTensor) -> StoredTensor:
    """The dequantized values as a plain dense ``StoredTensor`` (a slice or reshape does not keep the blocks)."""
    return StoredTensor(tensor.shape, tensor.dtype, tensor.read, tensor.where, DENSE)


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)
