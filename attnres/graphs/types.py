"""Element types of every value in a graph, including the outputs of attnres nodes (which onnx cannot infer)."""

from __future__ import annotations

import onnx
from onnx import helper as oh

from attnres.ops.identity import DOMAIN, ORT_TRT_DOMAIN


def value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Map value name -> ``TensorProto`` element type, by shape inference on a proxy graph.

    The proxy replaces each attnres node by ``Identity(source 0)``: same output type, standard op.
    """
    proxy = onnx.ModelProto()
    proxy.CopyFrom(model)
    nodes = []
    for node in proxy.graph.node:
        if node.domain in (DOMAIN, ORT_TRT_DOMAIN):
            nodes.append(oh.make_node("Identity", [node.input[1]], [node.output[0]], name=node.name))
        else:
            nodes.append(node)
    del proxy.graph.node[:]
    proxy.graph.node.extend(nodes)
    del proxy.graph.value_info[:]
    del proxy.functions[:]
    inferred = onnx.shape_inference.infer_shapes(proxy, data_prop=False)
    types: dict[str, int] = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    for init in model.graph.initializer:
        types[init.name] = init.data_type
    return types
