"""Softmaxes written out by hand: ``exp(x) / sum(exp(x))`` (optionally ``x - max(x)`` first), as some
implementations write the depth softmax. Each is presented to the matcher as a Softmax node that is not in the
graph: its input is the exponent's argument, its output the quotient, its axis the summed axis. When the site is
fused, the hand-written nodes only fed the old subgraph and dead-code elimination removes them."""

from __future__ import annotations

import onnx
from onnx import helper as oh

from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.ops.onnx_nodes import attribute


def _through_casts(index: GraphIndex, name: str) -> onnx.NodeProto | None:
    node = index.producer.get(name)
    while node is not None and node.op_type in ("Cast", "Identity"):
        node = index.producer.get(node.input[0])
    return node


def handwritten_softmaxes(index: GraphIndex) -> list[onnx.NodeProto]:
    """A virtual ``Softmax(axis)`` per ``Div(Exp(x), ReduceSum(Exp(x), axes=[axis], keepdims=1))``."""
    found = []
    for node in index.nodes:
        if node.op_type != "Div" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        exp, total = _through_casts(index, node.input[0]), _through_casts(index, node.input[1])
        if exp is None or total is None or exp.op_type != "Exp" or total.op_type != "ReduceSum":
            continue
        if _through_casts(index, total.input[0]) is not exp or attribute(total, "keepdims", 1) != 1:
            continue
        axes = index.int_list(total, 1, "axes")
        if axes is None or len(axes) != 1:
            continue
        found.append(oh.make_node("Softmax", [exp.input[0]], [node.output[0]], name=node.name or node.output[0],
                                  axis=int(axes[0])))
    return found
