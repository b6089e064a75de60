"""The storage types of the op set, described once: names, torch/NumPy/ONNX/TensorRT/kernel spellings and pass bars.

Every other module looks a storage type up here instead of keeping its own table. This module imports nothing
heavy (the GPU self-test uses it on machines without onnx): ONNX element types are their fixed enum values.
"""

from __future__ import annotations

from dataclasses import dataclass

ONNX_UNDEFINED, ONNX_FLOAT, ONNX_FLOAT16, ONNX_BFLOAT16 = 0, 1, 10, 16
"""``onnx.TensorProto`` element types (fixed by the ONNX standard)."""


@dataclass(frozen=True)
class Tolerance:
    """Pass bar against the float32 PyTorch reference: relative L2 at most ``rel_l2``, cosine at least ``cosine``."""

    rel_l2: float
    cosine: float


@dataclass(frozen=True)
class StorageType:
    """One storage type T of the op set (all arithmetic is float32 whatever T is)."""

    name: str
    onnx: int
    """``TensorProto`` element type."""
    onnx_type: str
    """Type string in ONNX schemas, e.g. ``tensor(float16)``."""
    tensorrt: str
    """``tensorrt.DataType`` member name."""
    kernel_code: int
    """``AttnresDtype`` code of the kernels' C ABI (plugins/common/attnresKernelApi.h)."""
    tolerance: Tolerance
    """Default pass bar (docs/parity.md#pass-bars)."""


STORAGE_TYPES: dict[str, StorageType] = {
    t.name: t
    for t in (
        StorageType("float32", ONNX_FLOAT, "tensor(float)", "FLOAT", 0, Tolerance(1e-5, 0.999999)),
        StorageType("float16", ONNX_FLOAT16, "tensor(float16)", "HALF", 1, Tolerance(5e-3, 0.9999)),
        StorageType("bfloat16", ONNX_BFLOAT16, "tensor(bfloat16)", "BF16", 2, Tolerance(2e-2, 0.999)),
    )
}
"""Name -> storage type, in the order float32, float16, bfloat16."""

HALF_PRECISION = frozenset({"float16", "bfloat16"})
"""The 16-bit storage types (a parity check also runs PyTorch in them, docs/parity.md#pass-bars)."""

BY_ONNX: dict[int, StorageType] = {t.onnx: t for t in STORAGE_TYPES.values()}

ONNX_TYPE_STRINGS = [t.onnx_type for t in STORAGE_TYPES.values()]

TENSORRT_TO_NAME: dict[str, str] = {
    **{t.tensorrt: t.name for t in STORAGE_TYPES.values()},
    "INT32": "int32", "INT64": "int64", "INT8": "int8", "UINT8": "uint8", "BOOL": "bool",
}
"""``tensorrt.DataType`` member name -> torch/NumPy dtype name, for every type an engine's I/O may have."""

INPUT_DTYPES = (*STORAGE_TYPES, "int64", "int32", "bool")
"""Dtypes an example input of a foreign model may have (``--example-shape NAME:dims:DTYPE``)."""

DTYPE_ALIASES: dict[str, str] = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
"""Short spellings other tools use (optimum-cli, trtexec), accepted wherever a storage type is named."""


def canonical_dtype(name: str) -> str:
    """``name`` with an alias replaced by the storage type it spells (``fp16`` -> ``float16``); other names as
    they are, for the caller to check against its table."""
    return DTYPE_ALIASES.get(name, name)


def onnx_type_name(elem_type: int) -> str:
    """A readable name of any ONNX element type: ``float16``, ``int64``, ``unknown``."""
    if elem_type in BY_ONNX:
        return BY_ONNX[elem_type].name
    if elem_type == ONNX_UNDEFINED:
        return "unknown"
    from onnx import TensorProto

    return TensorProto.DataType.Name(elem_type).lower()


def torch_dtype(name: str):
    """The torch dtype called ``name`` (torch is imported lazily: this module sits below everything)."""
    import torch

    return getattr(torch, name)
