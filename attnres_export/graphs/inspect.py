"""What an ONNX file holds, as plain data: opsets, inputs with their dynamic dims, attnres nodes by input count."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from attnres_export.errors import GraphError
from attnres_export.graphs.onnx_utils import metadata
from attnres_export.graphs.targets import detect_target
from attnres_export.ops.identity import AGGREGATE, DOMAIN, ORT_TRT_DOMAIN


@dataclass
class OnnxSummary:
    opsets: dict[str, int]
    inputs: list[tuple[str, str, list[str]]]
    outputs: list[tuple[str, str, list[str]]]
    target: str
    nodes: int
    fused_by_arity: dict[tuple[str, int], int]
    export_info: dict = field(default_factory=dict)


def load_onnx(path: Path, load_external_data: bool = True) -> onnx.ModelProto:
    """Load an ONNX file, refusing anything else with one line."""
    path = Path(path)
    if not path.is_file():
        raise GraphError(f"{path}: no such file")
    try:
        return onnx.load(str(path), load_external_data=load_external_data)
    except Exception as exc:
        raise GraphError(f"{path}: not a readable ONNX model ({type(exc).__name__}); is it corrupted?") from exc


def _dims(value: onnx.ValueInfoProto) -> list[str]:
    return [d.dim_param or str(d.dim_value) if (d.dim_param or d.dim_value) else "?"
            for d in value.type.tensor_type.shape.dim]


def _type_name(value: onnx.ValueInfoProto) -> str:
    return onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name \
        if value.type.tensor_type.elem_type != onnx.TensorProto.BFLOAT16 else "bfloat16"


def _data_inputs(node: onnx.NodeProto) -> int:
    """Sources of an AttnResAggregate (inputs after the score weight); present inputs of any other op."""
    if node.op_type == AGGREGATE:
        return len(node.input) - 1
    return sum(1 for name in node.input if name)


def summarize(model: onnx.ModelProto) -> OnnxSummary:
    fused = Counter(
        (n.op_type, _data_inputs(n)) for n in model.graph.node if n.domain in (DOMAIN, ORT_TRT_DOMAIN)
    )
    info = metadata(model).get("attnres.export")
    return OnnxSummary(
        opsets={e.domain or "ai.onnx": e.version for e in model.opset_import},
        inputs=[(v.name, _type_name(v), _dims(v)) for v in model.graph.input],
        outputs=[(v.name, _type_name(v), _dims(v)) for v in model.graph.output],
        target=detect_target(model),
        nodes=len(model.graph.node),
        fused_by_arity=dict(sorted(fused.items())),
        export_info=json.loads(info) if info else {},
    )
