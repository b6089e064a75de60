"""A tensor of a weight store: its shape, its stored type and how to read it, before anything is read.

A family's folder reader works on these as it would on tensors (rename, stack experts, narrow, compare a tied
head), and nothing is read until a model or an export asks for one tensor: ``torch.stack``, ``torch.cat`` and
``torch.equal`` on them are answered here (``__torch_function__``), a slice or a reshape is recorded."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from attnres_export.dtypes import STORAGE_TYPES, torch_dtype
from attnres_export.errors import CheckpointError

DENSE = "dense"
"""The storage format of a tensor held as plain values of its dtype (the quantized formats come with their own)."""

STORED_TYPES = frozenset(torch_dtype(name) for name in STORAGE_TYPES)
"""The types weights may be stored in: the storage types (float32, float16, bfloat16). float64 (no export holds
it) and the float8 and integer types (a quantized checkpoint's parts, which ``models.store.quantized`` joins into
weights first) are refused by ``check_stored_type``, the one place that decides. A one-byte type admitted here
needs ``finite`` to widen it first: torch calls every float8_e8m0fnu value finite, its NaN (0xFF) included."""


def check_stored_type(name: str, dtype: torch.dtype, where: object) -> None:
    """Refuse a tensor stored in a type other than ``STORED_TYPES``, naming it and its type."""
    if dtype not in STORED_TYPES:
        raise CheckpointError(f"{where}: {name} is stored as {str(dtype).removeprefix('torch.')}; attnres "
                              "reads weights stored as float32, float16 or bfloat16 (convert the checkpoint to one "
                              "of them)")


class StoredTensor:
    """One tensor of a store: ``shape``, ``dtype`` (as stored), ``format`` and ``read()``. ``read`` returns a tensor
    the caller owns (possibly a read-only mapping of the file), checked finite and cast to ``dtype`` when given."""

    def __init__(self, shape: Sequence[int], dtype: torch.dtype, read: Callable[[], torch.Tensor], where: str,
                 format: str = DENSE) -> None:
        self.shape = torch.Size(shape)
        self.dtype = dtype
        self.format = format
        self.where = where
        """What to name in an error: ``file: tensor``."""
        self._read = read

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        tensor = self._read()
        if tensor.shape != self.shape or tensor.dtype != self.dtype:
            raise CheckpointError(f"{self.where}: changed while it was being read ({tensor.dtype} "
                                  f"{list(tensor.shape)}, was {self.dtype} {list(self.shape)}); load it again")
        finite(tensor, self.where)
        return tensor if dtype is None or dtype == tensor.dtype else tensor.to(dtype)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def size(self, dim: int | None = None) -> torch.Size | int:
        return self.shape if dim is None else self.shape[dim]

    def __getitem__(self, index) -> StoredTensor:
        shape = torch.empty(self.shape, device="meta")[index].shape
        return StoredTensor(shape, self.dtype, lambda: self.read()[index], self.where, self.format)

    def reshape(self, *shape) -> StoredTensor:
        new = torch.empty(self.shape, device="meta").reshape(*shape).shape
        return StoredTensor(new, self.dtype, lambda: self.read().reshape(new), self.where, self.format)

    def __repr__(self) -> str:
        return f"StoredTensor({self.where}, {str(self.dtype).removeprefix('torch.')}, {list(self.shape)})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.stack:
            return _joined(args[0], kwargs.get("dim", args[1] if len(args) > 1 else 0), torch.stack)
        if func is torch.cat:
            return _joined(args[0], kwargs.get("dim", args[1] if len(args) > 1 else 0), torch.cat)
        if func is torch.equal:
            a, b = (x.read() if isinstance(x, StoredTensor) else x for x in args[:2])
            return torch.equal(a, b)
        return NotImplemented


def _joined(parts: Sequence[StoredTensor], dim: int, join: Callable) -> StoredTensor:
    """``join`` (``torch.stack`` or ``torch.cat``) of ``parts``, read when it is read."""
    parts = list(parts)
    dtypes = {part.dtype for part in parts}
    if len(dtypes) > 1:
        raise CheckpointError(f"{parts[0].where}: joined with tensors of other types ({sorted(map(str, dtypes))})")
    shape = join([torch.empty(part.shape, device="meta") for part in parts], dim).shape
    return StoredTensor(shape, parts[0].dtype, lambda: join([part.read() for part in parts], dim),
                        f"{parts[0].where} and {len(parts) - 1} more", parts[0].format)


def finite(value: torch.Tensor, where: str) -> torch.Tensor:
    """``value`` when it holds no NaN or infinity. A finite float32 sum proves it (a NaN or an infinity makes every
    sum NaN or infinite) in one pass and without a mask, several times faster than ``isfinite`` over the weights
    (docs/exporter-notes.md#assembled-export); only a sum that is not finite (such a value, or finite values whose
    sum overflows float32) is checked element by element."""
    if not bool(torch.isfinite(value.sum(dtype=torch.float32))) and not bool(torch.isfinite(value).all()):
        raise CheckpointError(f"{where} holds NaN or infinite values; the weights are corrupted (re-save them from "
                              "a healthy model)")
    return value
