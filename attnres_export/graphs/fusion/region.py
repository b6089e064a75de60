"""The piece of the graph an aggregation spans, cut out as a model of its own so it can be run alone."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper as oh

from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.graph import GraphIndex, subgraph_inputs

BASE_LIMIT, PER_SOURCE_LIMIT = 400, 60
"""Most nodes a region may hold; a bigger one depends on far more than its sources."""


@dataclass
class Region:
    """Nodes computing ``output`` from ``sources`` (plus ``context``: values only read through Shape/Size)."""

    nodes: list[onnx.NodeProto]
    sources: list[str]
    context: list[str]
    output: str


def extract_region(index: GraphIndex, sources: list[str], output: str) -> Region:
    """Walk back from ``output`` to the sources; reaching a graph input (a non-constant query, a mask) rejects."""
    limit = BASE_LIMIT + PER_SOURCE_LIMIT * len(sources)
    members: set[int] = set()
    shape_reads: set[str] = set()
    seen, stack = set(sources), [output]
    while stack:
        name = stack.pop()
        if name in seen or not name or name in index.initializers:
            continue
        seen.add(name)
        node = index.producer.get(name)
        if node is None:
            raise Rejected(f"the weights depend on graph input {name!r}, not only on the sources and constants")
        position = index.position[id(node)]
        if position in members:
            continue
        members.add(position)
        if len(members) > limit:
            raise Rejected(f"the aggregation depends on more than {limit} nodes besides its sources")
        if node.op_type in ("Shape", "Size"):
            shape_reads.add(node.input[0])
            continue
        stack.extend(i for i in (*node.input, *subgraph_inputs(node)) if i)
    nodes = [index.nodes[p] for p in sorted(members)]
    produced = {o for node in nodes for o in node.output}
    context = sorted(n for n in shape_reads if n not in produced and n not in sources and n not in index.initializers)
    return Region(nodes, list(dict.fromkeys(sources)), context, output)


def region_model(index: GraphIndex, region: Region, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A standalone model: inputs are the region's sources and context, output its result."""
    used = {i for node in region.nodes for i in (*node.input, *subgraph_inputs(node))}
    inputs = [_info(name, values[name]) for name in (*region.sources, *region.context)]
    graph = oh.make_graph(
        region.nodes, "attnres_region", inputs, [_info(region.output, values[region.output])],
        initializer=[init for name, init in index.initializers.items() if name in used],
    )
    model = oh.make_model(graph, opset_imports=list(index.model.opset_import), ir_version=index.model.ir_version)
    model.functions.extend(index.model.functions)
    return model


def _info(name: str, value: np.ndarray) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, oh.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
