"""Reading and pruning the ONNX graphs the ONNX Runtime rewrites work on: who produces and who reads a value
(through the branches of an ``If`` and the body of a ``Loop``), constant operands, and dropping what nothing reads."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper as oh
from onnx import numpy_helper
from onnx.external_data_helper import uses_external_data

from attnres_export.graphs.onnx_utils import subgraphs

MS_DOMAIN = "com.microsoft"
"""ONNX Runtime's contrib-op domain."""

_PASS_THROUGH = ("Unsqueeze", "Reshape", "Cast")
"""Nodes between the cache and the attention that change no value: the grouped heads' Unsqueeze/Reshape, and a
float16 model's Casts to float32 (its attention computes in float32; GroupQueryAttention takes the stored type).
Only a Cast to float32 passes (``_passes``)."""


def drop_dead_nodes(graph: onnx.GraphProto) -> None:
    """Remove the nodes nothing reads any more (the replaced attention, the causal mask), then order the rest."""
    needed = {o.name for o in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(_topological(graph)):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(i for i in reads(node) if i)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    used = {i for n in graph.node for i in reads(n)}
    keep = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)


def all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """``graph``'s nodes and those of every graph its nodes hold (If branches, Loop bodies), nested ones included."""
    found = []
    for node in graph.node:
        found.append(node)
        for sub in subgraphs(node):
            found += all_nodes(sub)
    return found


def declared_shapes(graph: onnx.GraphProto) -> dict[str, list]:
    """Declared shapes by value name: each dimension an int, a symbol, or None when unknown."""
    shapes = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            shapes[value.name] = [d.dim_value if d.HasField("dim_value") else d.dim_param or None
                                  for d in tensor.shape.dim]
    return shapes


def reads(node: onnx.NodeProto) -> list[str]:
    """The values ``node`` reads: its inputs, and what the graphs of its attributes (an If's branches, a Loop's
    body) read from the enclosing graph."""
    names = list(node.input)
    for sub in subgraphs(node):
        inner = {o for n in sub.node for o in n.output} | {v.name for v in sub.input}
        inner |= {i.name for i in sub.initializer}
        names += [name for n in sub.node for name in reads(n) if name not in inner]
    return names


def _topological(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    ready = {v.name for v in graph.input} | {i.name for i in graph.initializer} | {""}
    produced = {o for n in graph.node for o in n.output}
    pending, ordered = list(graph.node), []
    while pending:
        progress = [n for n in pending if all(i in ready or i not in produced for i in reads(n))]
        if not progress:
            raise ValueError("the graph has a cycle or reads a value nothing produces")
        for node in progress:
            ordered.append(node)
            ready.update(node.output)
        pending = [n for n in pending if all(n is not p for p in progress)]
    return ordered


class Nodes:
    def __init__(self, graph: onnx.GraphProto) -> None:
        self.by_output = {o: n for n in graph.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in dict.fromkeys(reads(node)):
                self.consumers.setdefault(name, []).append(node)
        for value in graph.output:  # a graph output is a reader too: what it reads must stay
            self.consumers.setdefault(value.name, []).append(oh.make_node("GraphOutput", [value.name], []))

    def producer(self, name: str) -> onnx.NodeProto | None:
        return self.by_output.get(name)

    def only_consumer(self, name: str, op_type: str) -> onnx.NodeProto | None:
        readers = self.consumers.get(name, [])
        return readers[0] if len(readers) == 1 and readers[0].op_type == op_type else None

    def follow(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The ``op_type`` node reached from ``name`` through single-reader Unsqueezes/Reshapes."""
        while True:
            readers = [r for r in self.consumers.get(name, []) if r.op_type == op_type or _passes(r)]
            if len(readers) != 1:
                return None
            if readers[0].op_type == op_type:
                return readers[0]
            name = readers[0].output[0]

    def source(self, name: str) -> str:
        """``name`` before the Unsqueezes/Reshapes that produced it."""
        while (node := self.by_output.get(name)) is not None and _passes(node):
            name = node.input[0]
        return name


def _passes(node: onnx.NodeProto) -> bool:
    return node.op_type in _PASS_THROUGH and (node.op_type != "Cast" or attr(node, "to", 0) == onnx.TensorProto.FLOAT)


def scalar_operand(graph: onnx.GraphProto, nodes: Nodes, node: onnx.NodeProto, other_than: str) -> float | None:
    """The value of ``node``'s other operand when it is a one-element constant."""
    value = constant_value(graph, nodes, node.input[1] if node.input[0] == other_than else node.input[0])
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def constant_tensor(graph: onnx.GraphProto, nodes: Nodes, name: str) -> onnx.TensorProto | None:
    """The initializer or Constant node value of ``name`` (None for a computed value); its data may be external."""
    tensor = next((i for i in graph.initializer if i.name == name), None)
    producer = nodes.producer(name)
    if tensor is None and producer is not None and producer.op_type == "Constant" and producer.attribute:
        tensor = producer.attribute[0].t if producer.attribute[0].name == "value" else None
    return tensor


def constant_value(graph: onnx.GraphProto, nodes: Nodes, name: str) -> np.ndarray | None:
    """The value of an initializer or a Constant node's output (None for a computed value, and for a tensor in an
    external data file: an export's graph is rewritten without its weights loaded)."""
    tensor = constant_tensor(graph, nodes, name)
    return None if tensor is None or uses_external_data(tensor) else numpy_helper.to_array(tensor)


def attr(node: onnx.NodeProto, name: str, default):
    for attribute in node.attribute:
        if attribute.name == name:
            return oh.get_attribute_value(attribute)
    return default


def import_microsoft_domain(model: onnx.ModelProto) -> None:
    """Declare ``com.microsoft`` (version 1) in ``model``'s opset imports, once."""
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(oh.make_opsetid(MS_DOMAIN, 1))
