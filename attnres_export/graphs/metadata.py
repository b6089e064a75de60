"""What an exported ONNX says about itself: the attnres-export metadata, its dtype and its input axes."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import BinaryIO

import onnx

from attnres_export.dtypes import BY_ONNX
from attnres_export.errors import GraphError
from attnres_export.graphs.onnx_utils import metadata

EXPORT_KEY = "attnres.export"
"""Model metadata written by attnres-export: how the file was exported (dtype, target, dim ranges: the defaults
of ``attnres build``)."""
QUANTIZE_KEY = "quantize"
"""The export metadata's record of ``--quantize`` (``bits``, ``block_size``, ``embeddings``): ``attnres check``
quantizes the checkpoint the same way before it compares."""
INT8_ACTIVATIONS_KEY = "int8_activations"
"""The export metadata's record of ``--int8-activations``: each weight written as a ``MatMulNBits`` that quantizes
its activations to int8 (state_dict name -> block size), whose input the check's reference quantizes the same way
(``parity/int8_activations.py``)."""


def export_info(model: onnx.ModelProto) -> dict:
    """The attnres-export metadata of ``model`` ({} when the file was not written by attnres-export)."""
    raw = metadata(model).get(EXPORT_KEY)
    if not raw:
        return {}
    try:
        info = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise GraphError(f"metadata {EXPORT_KEY!r} is not JSON ({exc.msg}); re-export the model") from exc
    if not isinstance(info, dict):
        raise GraphError(f"metadata {EXPORT_KEY!r} is not a JSON object; re-export the model")
    return info


_METADATA_PROPS = 14
"""``ModelProto.metadata_props``: repeated ``StringStringEntryProto`` (``key`` is its field 1)."""
_FIXED_SIZES = {1: 8, 5: 4}
"""Protobuf wire types of fixed size: 64-bit and 32-bit."""
_MAX_ENTRY_BYTES = 64 << 20


def records_export(path: Path) -> bool:
    """Whether the ONNX file ``path`` carries attnres-export's metadata (False for any other file), read off the
    protobuf wire: the graph is skipped, not parsed (a model under 2 GB holds its weights inline, so loading it to
    ask would read them all)."""
    try:
        with open(path, "rb") as stream:
            end = os.fstat(stream.fileno()).st_size
            while stream.tell() < end:
                field, wire = divmod(_varint(stream), 8)
                if wire == 0:
                    _varint(stream)
                elif wire in _FIXED_SIZES:
                    stream.seek(_FIXED_SIZES[wire], os.SEEK_CUR)
                elif wire != 2:
                    return False
                elif (length := _varint(stream)) > _MAX_ENTRY_BYTES or field != _METADATA_PROPS:
                    stream.seek(length, os.SEEK_CUR)
                elif _entry_key(stream.read(length)) == EXPORT_KEY.encode():
                    return True
    except (OSError, ValueError):
        return False
    return False


def _entry_key(entry: bytes) -> bytes | None:
    """The ``key`` of a serialized ``StringStringEntryProto`` (written first, as field 1)."""
    stream = io.BytesIO(entry)
    if _varint(stream) != (1 << 3 | 2):
        return None
    return stream.read(_varint(stream))


def _varint(stream: BinaryIO) -> int:
    value = shift = 0
    while byte := stream.read(1):
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
    raise ValueError("truncated varint")


def onnx_dtype(model: onnx.ModelProto) -> str:
    """The export dtype from the metadata, else the element type of the first floating-point output."""
    recorded = export_info(model).get("dtype")
    if recorded:
        return recorded
    for value in model.graph.output:
        elem = value.type.tensor_type.elem_type
        if elem in BY_ONNX:
            return BY_ONNX[elem].name
    raise GraphError("cannot tell the ONNX's dtype (no attnres.export metadata, no float output); re-export it")


def input_axes(model: onnx.ModelProto) -> dict[str, list[str | int]]:
    """Per graph input, each axis as its dim name (dynamic) or its size (static)."""
    initializers = {i.name for i in model.graph.initializer}
    axes: dict[str, list[str | int]] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        axes[value.name] = [d.dim_param if d.dim_param else d.dim_value for d in dims]
    return axes
