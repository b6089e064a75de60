"""What an exported ONNX says about itself: the attnres-export metadata, its dtype and its input axes."""

from __future__ import annotations

import json

import onnx

from attnres_export.dtypes import BY_ONNX
from attnres_export.errors import GraphError
from attnres_export.graphs.onnx_utils import metadata

EXPORT_KEY = "attnres.export"
"""Model metadata written by attnres-export: how the file was exported (dtype, target, dim ranges: the defaults
of ``attnres build``)."""


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
