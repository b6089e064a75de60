"""RMSNorms of an onnxruntime-genai folder's model as ONNX Runtime's ``SimplifiedLayerNormalization`` (what its
model builder writes; docs/genai.md#attention-as-groupqueryattention-norms-as-simplifiedlayernormalization).

A float32 RMSNorm exports as seven nodes, ``Mul(Mul(x, Reciprocal(Sqrt(Add(ReduceMean(Pow(x, 2), [-1]), eps)))),
weight)``; ONNX Runtime's own fusion does not recognise that spelling (it looks for a ``Div``), and a decode step
at batch 1 pays for every node it runs. ``SimplifiedLayerNormalization(x, weight, axis=-1, epsilon=eps)`` computes
``x / sqrt(mean(x^2) + eps) * weight`` in float32, the same function. A float16 model's norms (Casts around the same
nodes) are left as they are.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper as oh
from onnx.defs import OpSchema

from attnres_export.graphs.onnxruntime_ops.nodes import (
    MS_DOMAIN,
    Nodes,
    attr,
    constant_tensor,
    constant_value,
    drop_dead_nodes,
    import_microsoft_domain,
    scalar_operand,
)

_FLOATS = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)", "tensor(double)"]


def simplified_layer_norm_schema() -> OpSchema:
    """ONNX Runtime's ``SimplifiedLayerNormalization`` (registered in the default ONNX domain, version 1, as ONNX
    Runtime declares it), so that ``onnx.checker`` passes the files that hold it."""
    param, optional = OpSchema.FormalParameter, OpSchema.FormalParameterOption.Optional
    return OpSchema(
        "SimplifiedLayerNormalization", "", 1, doc="x / sqrt(mean(x^2) + epsilon) * scale (ONNX Runtime)",
        inputs=[param("X", "T", "input"), param("scale", "V", "weight")],
        outputs=[param("Y", "V", "output"), param("inv_std_var", "U", "saved for training", param_option=optional)],
        type_constraints=[("T", _FLOATS, "input"), ("U", ["tensor(float)", "tensor(double)"], "statistics"),
                          ("V", _FLOATS, "output")],
        attributes=[OpSchema.Attribute(name, kind, name, required=False) for name, kind in
                    (("axis", OpSchema.AttrType.INT), ("epsilon", OpSchema.AttrType.FLOAT),
                     ("stash_type", OpSchema.AttrType.INT))],
    )


def simplified_layer_norms(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place; returns how many RMSNorms became one node."""
    graph = model.graph
    count = 0
    for power in [n for n in graph.node if n.op_type == "Pow"]:
        count += _rewrite(graph, Nodes(graph), power)
    if count:
        drop_dead_nodes(graph)
    return count


def _rewrite(graph: onnx.GraphProto, nodes: Nodes, power: onnx.NodeProto) -> bool:
    x = power.input[0]
    if scalar_operand(graph, nodes, power, x) != 2.0 or power.input[1] == x:
        return False
    mean = nodes.only_consumer(power.output[0], "ReduceMean")
    if mean is None or attr(mean, "keepdims", 1) != 1 or not _last_axis(graph, nodes, mean):
        return False
    add = nodes.only_consumer(mean.output[0], "Add")
    eps = scalar_operand(graph, nodes, add, mean.output[0]) if add is not None else None
    root = nodes.only_consumer(add.output[0], "Sqrt") if eps is not None else None
    inverse = nodes.only_consumer(root.output[0], "Reciprocal") if root is not None else None
    scaled = nodes.only_consumer(inverse.output[0], "Mul") if inverse is not None else None
    if scaled is None or set(scaled.input) != {x, inverse.output[0]}:
        return False
    weighted = nodes.only_consumer(scaled.output[0], "Mul")
    if weighted is None:
        return False
    weight = weighted.input[1] if weighted.input[0] == scaled.output[0] else weighted.input[0]
    tensor = constant_tensor(graph, nodes, weight)
    if tensor is None or len(tensor.dims) != 1 or tensor.data_type != onnx.TensorProto.FLOAT:
        return False
    graph.node.append(oh.make_node("SimplifiedLayerNormalization", [x, weight], [weighted.output[0]],
                                   name=f"genai/rms_norm/{weighted.output[0]}", axis=-1, epsilon=eps,
                                   stash_type=1))
    graph.node.remove(weighted)
    return True


def _last_axis(graph: onnx.GraphProto, nodes: Nodes, mean: onnx.NodeProto) -> bool:
    axes = constant_value(graph, nodes, mean.input[1]) if len(mean.input) > 1 else np.array(attr(mean, "axes", []))
    return axes is not None and axes.reshape(-1).tolist() == [-1]


def skip_layer_norms(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place: each ``SimplifiedLayerNormalization`` of a residual sum ``Add(a, b)`` of two
    values that are not constants (a bias add broadcasts, which the op does not) becomes
    ``com.microsoft.SkipSimplifiedLayerNormalization(a, b, weight)``, whose fourth output is the sum itself for the
    sum's other readers (the next residual): one node where two ran. Returns the count."""
    graph = model.graph
    nodes = Nodes(graph)
    count = 0
    for norm in [n for n in graph.node if n.op_type == "SimplifiedLayerNormalization" and not n.domain]:
        add = nodes.producer(norm.input[0])
        if (add is None or add.op_type != "Add" or len(norm.output) > 1 or add.input[0] == add.input[1]
                or any(constant_tensor(graph, nodes, name) is not None for name in add.input)):
            continue
        graph.node.append(oh.make_node(
            "SkipSimplifiedLayerNormalization", [*add.input, norm.input[1]], [norm.output[0], "", "", add.output[0]],
            name=f"{norm.name}/skip", domain=MS_DOMAIN, epsilon=attr(norm, "epsilon", 1e-5)))
        graph.node.remove(norm)
        graph.node.remove(add)
        count += 1
    if count:
        import_microsoft_domain(model)
        drop_dead_nodes(graph)
    return count
