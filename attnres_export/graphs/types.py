"""Element types and static shapes of every value in a graph, including the outputs of attnres nodes (which onnx
cannot infer): shape inference runs on a proxy graph where each attnres node is replaced by standard ops."""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import helper as oh

from attnres_export.graphs.onnx_utils import subgraphs, weightless_copy
from attnres_export.ops.descriptors import Shape, descriptor_of, is_attnres


@dataclass(frozen=True)
class ValueInfo:
    elem_type: int
    shape: Shape


def value_infos(model: onnx.ModelProto) -> dict[str, ValueInfo]:
    """Map value name -> element type and static shape (proxy outputs have no shape; inputs and initializers do).

    Call only on a model whose attnres nodes passed ``node_problems`` (the proxy reads their inputs).
    """
    proxy = weightless_copy(model)
    nodes = []
    for node in proxy.graph.node:
        nodes.extend(_proxy(node) if is_attnres(node) else [node])
    del proxy.graph.node[:]
    proxy.graph.node.extend(nodes)
    del proxy.graph.value_info[:]
    del proxy.functions[:]
    inferred = onnx.shape_inference.infer_shapes(proxy, data_prop=False)
    infos: dict[str, ValueInfo] = {}
    for graph in _graphs(inferred.graph):
        for value in [*graph.input, *graph.value_info, *graph.output]:
            tensor = value.type.tensor_type
            if value.type.HasField("tensor_type") and tensor.elem_type:
                shape = tuple(d.dim_value or None for d in tensor.shape.dim) if tensor.HasField("shape") else None
                infos.setdefault(value.name, ValueInfo(tensor.elem_type, shape))
    for graph in _graphs(model.graph):
        for init in graph.initializer:
            infos[init.name] = ValueInfo(init.data_type, tuple(init.dims))
    return infos


def _graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """``graph`` and every subgraph of its control-flow nodes (``If`` branches, ``Loop``/``Scan`` bodies), nested
    ones included: their values are typed by the same inference."""
    found = [graph]
    for node in graph.node:
        for sub in subgraphs(node):
            found.extend(_graphs(sub))
    return found


def value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Map value name -> ``TensorProto`` element type."""
    return {name: info.elem_type for name, info in value_infos(model).items()}


def _proxy(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """Standard nodes producing ``node``'s outputs with their element types (shapes are not preserved):
    storage-typed outputs copy the first storage input, float32 outputs are a Cast of it."""
    op = descriptor_of(node)
    storage = op.canonical_inputs(node)[op.storage_input]
    proxies = []
    for spec, output in zip(op.outputs, node.output, strict=False):
        if not output:
            continue
        if spec.storage:
            proxies.append(oh.make_node("Identity", [storage], [output], name=f"{node.name}/{spec.name}"))
        else:
            proxies.append(oh.make_node("Cast", [storage], [output], name=f"{node.name}/{spec.name}",
                                        to=onnx.TensorProto.FLOAT))
    return proxies
