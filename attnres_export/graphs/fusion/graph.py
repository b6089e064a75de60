"""A read-only index over an ONNX graph: producers, consumers, constants and topological positions."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import numpy_helper

from attnres_export.graphs.onnx_utils import subgraphs
from attnres_export.ops.onnx_nodes import attribute


def subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from the enclosing graph."""
    names: set[str] = set()
    for graph in subgraphs(node):
        for inner in graph.node:
            names.update(inner.input)
            names.update(subgraph_inputs(inner))
    return names


class GraphIndex:
    """Lookups over ``graph`` that the matcher needs many times."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        graph = model.graph
        self.nodes = list(graph.node)
        self.position = {id(n): i for i, n in enumerate(self.nodes)}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in self.nodes:
            for name in node.output:
                if name:
                    self.producer[name] = node
            for name in {*node.input, *subgraph_inputs(node)}:
                if name:
                    self.consumers[name].append(node)
        self.initializers = {i.name: i for i in graph.initializer}

    def constant(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it is an initializer or a Constant node's output, else None."""
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.producer.get(name)
        if node is None or node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
            return None
        for attr in node.attribute:
            if attr.name == "value":
                return numpy_helper.to_array(attr.t)
            if attr.name in ("value_float", "value_int"):
                return np.asarray(onnx.helper.get_attribute_value(attr))
            if attr.name in ("value_floats", "value_ints"):
                return np.asarray(onnx.helper.get_attribute_value(attr))
        return None

    def int_list(self, node: onnx.NodeProto, input_index: int, attr: str) -> list[int] | None:
        """An int list given as an input (newer opsets) or as an attribute (older ones)."""
        if len(node.input) > input_index and node.input[input_index]:
            value = self.constant(node.input[input_index])
            return None if value is None else [int(v) for v in np.asarray(value).ravel()]
        value = attribute(node, attr)
        return None if value is None else [int(v) for v in value]


def dead_code_elimination(graph: onnx.GraphProto) -> int:
    """Drop nodes whose outputs nobody reads, then unused initializers; returns the number of nodes dropped."""
    needed = {o.name for o in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output if name):
            kept.append(node)
            needed.update(n for n in (*node.input, *subgraph_inputs(node)) if n)
    dropped = len(graph.node) - len(kept)
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)
    live_inits = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(live_inits)
    produced = {o for n in kept for o in n.output}
    live_info = [v for v in graph.value_info if v.name in produced]
    del graph.value_info[:]
    graph.value_info.extend(live_info)
    return dropped
