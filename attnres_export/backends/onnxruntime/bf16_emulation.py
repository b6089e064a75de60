"""Run a bfloat16 model on ONNX Runtime CPU, which has no bfloat16 kernels for arithmetic ops.

Every computed bfloat16 tensor becomes float32, and after each op that computes a bfloat16 value a
``Cast(bfloat16) -> Cast(float)`` pair rounds it as bfloat16 storage would. Each op thus computes in float32
on bfloat16-rounded inputs and its result is rounded to bfloat16: the behaviour of a GPU kernel that
accumulates in float32. The file on disk is never changed; only the in-memory copy run by the check.

The weights stay bfloat16, where they are (in the file's external data, or in the proto): each bfloat16
initializer is read through a ``Cast`` to float32 (exact), which the session runs each time instead of folding
it into a float32 initializer (``SESSION_DISABLED_OPTIMIZERS``). A float32 copy of the weights would cost twice
their bytes for the whole check (docs/onnx-runtime-notes.md, "bfloat16 on the CPU provider").
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

SESSION_DISABLED_OPTIMIZERS = ("ConstantFolding",)
"""What a session on an emulated model runs without: constant folding would turn each weight's ``Cast`` into a
float32 initializer, the float32 copy the casts exist to avoid."""


def has_bfloat16(model: onnx.ModelProto) -> bool:
    return BF16 in set(value_types(model).values())


def emulate_bfloat16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` that computes in float32 and rounds every computed bfloat16 value (see module doc),
    inside the subgraphs of control-flow nodes too (the expert ``If``/``Loop`` of a mixture of experts). Its
    bfloat16 initializers keep their data, external or not, under new names; run it with
    ``SESSION_DISABLED_OPTIMIZERS`` disabled."""
    out = copy_model(model)
    _emulate_graph(out.graph, value_types(model), unique_namer(out.graph, "bf16emu"))
    return out


def _emulate_graph(graph: onnx.GraphProto, types: dict[str, int], fresh) -> None:
    nodes = _widened_initializers(graph, fresh)
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.elem_type == BF16:
            value.type.tensor_type.elem_type = F32
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


def _widened_initializers(graph: onnx.GraphProto, fresh) -> list[onnx.NodeProto]:
    """Each bfloat16 initializer renamed, and a ``Cast`` to float32 that gives its old name the float32 value
    (exact), so that every reader, in this graph or a subgraph, reads float32 without a float32 copy being
    stored. An initializer that is also a graph input (a caller may feed it) is converted instead."""
    inputs = {value.name for value in graph.input}
    casts = []
    for init in graph.initializer:
        if init.data_type != BF16:
            continue
        if init.name in inputs:
            init.CopyFrom(_as_float32(init))
            continue
        stored = fresh("weight")
        casts.append(oh.make_node("Cast", [stored], [init.name], to=F32))
        init.name = stored
    return casts


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
