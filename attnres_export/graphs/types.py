"""Element types of every value in a graph, including the outputs of attnres nodes (which onnx cannot infer)."""

from __future__ import annotations

import onnx
from onnx import helper as oh

from attnres_export.ops.identity import AGGREGATE, DOMAIN, ORT_TRT_DOMAIN, RESIDUAL_ATTENTION


def value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Map value name -> ``TensorProto`` element type, by shape inference on a proxy graph.

    The proxy replaces each attnres node by standard ops with the same output types (``_proxy``).
    """
    proxy = onnx.ModelProto()
    proxy.CopyFrom(model)
    nodes = []
    for node in proxy.graph.node:
        if node.domain in (DOMAIN, ORT_TRT_DOMAIN):
            nodes.extend(_proxy(node))
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


def _proxy(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """Standard nodes producing ``node``'s outputs with their element types (shapes are not preserved)."""
    if node.op_type == AGGREGATE:
        return [oh.make_node("Identity", [node.input[1]], [node.output[0]], name=node.name)]
    if node.op_type == RESIDUAL_ATTENTION:
        proxies = [oh.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name)]
        if len(node.output) > 1 and node.output[1]:
            proxies.append(oh.make_node("Cast", [node.input[0]], [node.output[1]], name=f"{node.name}/scores",
                                        to=onnx.TensorProto.FLOAT))
        return proxies
    raise ValueError(f"node {node.name!r}: unknown attnres op {node.op_type!r}")
