"""What an ONNX file holds, as plain data: opsets, inputs with their dynamic dims, attnres nodes by input count."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import onnx

from attnres_export.dtypes import onnx_type_name
from attnres_export.graphs.metadata import export_info
from attnres_export.graphs.onnxruntime_ops import OnnxRuntimeOps
from attnres_export.graphs.targets import detect_target
from attnres_export.ops.descriptors import OPS, is_attnres


@dataclass
class OnnxSummary:
    opsets: dict[str, int]
    inputs: list[tuple[str, str, list[str]]]
    outputs: list[tuple[str, str, list[str]]]
    target: str | None
    """The target the file is written for; None for a file with neither attnres nodes nor attnres-export's
    metadata (any ONNX model, e.g. a plain torch.onnx export, which is no target's)."""
    nodes: int
    fused_by_arity: dict[tuple[str, int], int]
    export_info: dict = field(default_factory=dict)
    weights: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """By stored element type (``int4``, ``float32``, ...): initializers, elements, bytes (from the headers)."""
    onnxruntime_ops: OnnxRuntimeOps | None = None
    """What the ``onnxruntime`` target wrote as ONNX Runtime's fused ops and kept in standard ops (None: another
    target)."""


def _dims(value: onnx.ValueInfoProto) -> list[str]:
    return [d.dim_param or str(d.dim_value) if (d.dim_param or d.dim_value) else "?"
            for d in value.type.tensor_type.shape.dim]


def _type_name(value: onnx.ValueInfoProto) -> str:
    return onnx_type_name(value.type.tensor_type.elem_type)


def summarize(model: onnx.ModelProto) -> OnnxSummary:
    fused = Counter((n.op_type, OPS[n.op_type].arity(n)) for n in model.graph.node if is_attnres(n))
    info, target = export_info(model), detect_target(model)
    return OnnxSummary(
        opsets={e.domain or "ai.onnx": e.version for e in model.opset_import},
        inputs=[(v.name, _type_name(v), _dims(v)) for v in model.graph.input],
        outputs=[(v.name, _type_name(v), _dims(v)) for v in model.graph.output],
        target=target if info or target != "portable" else None,
        nodes=len(model.graph.node),
        fused_by_arity=dict(sorted(fused.items())),
        export_info=info,
        weights=_weights(model.graph),
        onnxruntime_ops=OnnxRuntimeOps.of(model),
    )


def _weights(graph: onnx.GraphProto) -> dict[str, tuple[int, int, int]]:
    """The main graph's initializers by element type, their bytes as stored (external data's recorded length)."""
    groups: dict[str, list[int]] = {}
    for tensor in graph.initializer:
        elements = math.prod(tensor.dims)
        length = next((int(e.value) for e in tensor.external_data if e.key == "length"), None)
        if length is None:
            length = len(tensor.raw_data) if tensor.raw_data else _inline_bytes(tensor, elements)
        counts = groups.setdefault(onnx_type_name(tensor.data_type), [0, 0, 0])
        counts[0] += 1
        counts[1] += elements
        counts[2] += length
    return {name: (n, elements, size) for name, (n, elements, size) in sorted(groups.items())}


def _inline_bytes(tensor: onnx.TensorProto, elements: int) -> int:
    bits = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4}.get(tensor.data_type)
    if bits is not None:
        return (elements * bits + 7) // 8
    return elements * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
