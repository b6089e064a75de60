"""Run a bfloat16 model on ONNX Runtime CPU, which has no bfloat16 kernels for arithmetic ops.

Every bfloat16 tensor becomes float32, and after each op that computes a bfloat16 value a
``Cast(bfloat16) -> Cast(float)`` pair rounds it as bfloat16 storage would. Each op thus computes in float32
on bfloat16-rounded inputs and its result is rounded to bfloat16: the behaviour of a GPU kernel that
accumulates in float32. The file on disk is never changed; only the in-memory copy run by the check.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from attnres_export.graphs.onnx_utils import copy_model, replace_nodes, subgraphs, unique_namer
from attnres_export.graphs.types import value_types

BF16 = TensorProto.BFLOAT16
F32 = TensorProto.FLOAT

VALUE_PRESERVING = frozenset({
    "Reshape", "Transpose", "Gather", "GatherElements", "GatherND", "Slice", "Concat", "Split", "Squeeze",
    "Unsqueeze", "Expand", "Identity", "Flatten", "Tile", "Where", "Shape", "Size", "Max", "Min", "Neg",
    "Relu", "ReduceMax", "ReduceMin",
})
"""Ops whose bfloat16 outputs are exactly some of their (already rounded) inputs: no rounding needed."""


def has_bfloat16(model: onnx.ModelProto) -> bool:
    return BF16 in set(value_types(model).values())


def emulate_bfloat16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float32 copy of ``model`` that rounds every computed bfloat16 value (see module doc), inside the
    subgraphs of control-flow nodes too (the expert ``If``/``Loop`` of a mixture of experts)."""
    out = copy_model(model)
    _emulate_graph(out.graph, value_types(model), unique_namer(out.graph, "bf16emu"))
    return out


def _emulate_graph(graph: onnx.GraphProto, types: dict[str, int], fresh) -> None:
    for init in graph.initializer:
        if init.data_type == BF16:
            init.CopyFrom(_as_float32(init))
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.elem_type == BF16:
            value.type.tensor_type.elem_type = F32
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        _retype_attributes(node)
        for sub in subgraphs(node):
            _emulate_graph(sub, types, fresh)
        bf16_outputs = [o for o in node.output if o and types.get(o) == BF16]
        if not bf16_outputs or node.op_type in VALUE_PRESERVING or node.op_type == "Constant":
            nodes.append(node)
            continue
        renamed = {o: fresh("raw") for o in bf16_outputs}
        outputs = [renamed.get(o, o) for o in node.output]
        del node.output[:]
        node.output.extend(outputs)
        nodes.append(node)
        for original, raw in renamed.items():
            rounded = fresh("bf16")
            nodes.append(oh.make_node("Cast", [raw], [rounded], to=BF16))
            nodes.append(oh.make_node("Cast", [rounded], [original], to=F32))
    replace_nodes(graph, nodes)


def _retype_attributes(node: onnx.NodeProto) -> None:
    """Casts to bfloat16 become casts to float32 (the rounding pair re-adds the rounding); constants widen."""
    for attr in node.attribute:
        if attr.name in ("to", "dtype") and attr.type == onnx.AttributeProto.INT and attr.i == BF16:
            attr.i = F32
        elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == BF16:
            attr.t.CopyFrom(_as_float32(attr.t))


def _as_float32(tensor: onnx.TensorProto) -> onnx.TensorProto:
    values = numpy_helper.to_array(tensor).astype(np.float32)
    return numpy_helper.from_array(values, tensor.name)
