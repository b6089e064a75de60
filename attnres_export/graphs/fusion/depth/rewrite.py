"""Putting the verified fused nodes into the graph and dropping what only the old subgraphs used."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper as oh
from onnx import numpy_helper

from attnres_export.graphs.fusion.depth.node import aggregate_node
from attnres_export.graphs.fusion.graph import dead_code_elimination
from attnres_export.graphs.onnx_utils import copy_model, replace_nodes, set_domain_import, unique_namer
from attnres_export.ops.opset import DOMAIN, OPSET_VERSION


@dataclass
class AggregateReplacement:
    """One verified site: ``output`` becomes AttnResAggregate(score_weight, *sources) (cast to ``output_type``)."""

    name: str
    sources: list[str]
    output: str
    score_weight: np.ndarray
    eps: float
    cast_to: int | None
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    """Sources that are no tensor of the graph (slots of a stacked constant): added as initializers."""


def apply_replacements(model: onnx.ModelProto, replacements: list[AggregateReplacement]) -> onnx.ModelProto:
    """A copy of ``model`` whose replaced outputs come from fused nodes; unused nodes are then removed."""
    out = copy_model(model)
    if not replacements:
        return out
    graph = out.graph
    fresh = unique_namer(graph, "attnres_fusion")
    by_output = {r.output: r for r in replacements}
    renamed: dict[str, str] = {}
    for r in replacements:
        for slot, value in r.constants.items():
            if slot not in renamed:
                renamed[slot] = fresh("constant_source")
                graph.initializer.append(numpy_helper.from_array(value, renamed[slot]))
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        hits = [by_output[o] for o in node.output if o in by_output]
        if len(node.output) > 1:
            for i, name in enumerate(node.output):
                if name in by_output:
                    node.output[i] = fresh("unused")
            nodes.append(node)
        elif not hits:
            nodes.append(node)
        for r in hits:
            weight = fresh("score_weight")
            graph.initializer.append(numpy_helper.from_array(r.score_weight.astype(np.float32), weight))
            result = r.output if r.cast_to is None else fresh("aggregate")
            nodes.append(aggregate_node(r.name, weight, [renamed.get(s, s) for s in r.sources], result, r.eps))
            if r.cast_to is not None:
                nodes.append(oh.make_node("Cast", [result], [r.output], name=f"{r.name}/cast", to=r.cast_to))
    replace_nodes(graph, nodes)
    set_domain_import(out, DOMAIN, OPSET_VERSION)
    dead_code_elimination(graph)
    return out
