"""Softmaxes written out by hand: ``exp(x) / sum(exp(x))`` (optionally ``x - max(x)`` first), as some
implementations write the depth softmax. Each is presented to the matcher as a Softmax node that is not in the
graph: its input is the exponent's argument, its output the quotient, its axis the summed axis. When the site is
fused, the hand-written nodes only fed the old subgraph and dead-code elimination removes them.

An online softmax divides after the weighted sum instead: ``sum(exp(x) * v) / sum(exp(x))``. Its virtual
Softmax outputs the unnormalized ``exp(x)``; the matcher follows the weighted sum through that division
(match.py)."""

from __future__ import annotations

import onnx
from onnx import helper as oh

from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.ops.onnx_nodes import attribute

BROADCASTS = ("Cast", "Identity", "Unsqueeze", "Reshape", "Expand")
"""Ops between a sum of exponentials and the division by it (keepdims=0 sums are unsqueezed back)."""


def _through_casts(index: GraphIndex, name: str, ops: tuple[str, ...] = ("Cast", "Identity")) -> onnx.NodeProto | None:
    node = index.producer.get(name)
    while node is not None and node.op_type in ops:
        node = index.producer.get(node.input[0])
    return node


def exp_sum_divisor(index: GraphIndex, name: str) -> onnx.NodeProto | None:
    """The Exp whose single-axis ReduceSum ``name`` is (through casts and unsqueezes), else None."""
    total = _through_casts(index, name, BROADCASTS)
    if total is None or total.op_type != "ReduceSum" or len(index.int_list(total, 1, "axes") or []) != 1:
        return None
    exp = _through_casts(index, total.input[0])
    return exp if exp is not None and exp.op_type == "Exp" else None


def _unshifted(index: GraphIndex, name: str) -> str:
    """``x`` for ``x - max(x)``: the same softmax, and logits that still say the score weight when there is one
    source (``x - max(x)`` is then 0)."""
    sub = index.producer.get(name)
    if sub is None or sub.op_type != "Sub":
        return name
    peak = _through_casts(index, sub.input[1], BROADCASTS)
    if peak is None or peak.op_type != "ReduceMax" or peak.input[0] != sub.input[0]:
        return name
    return sub.input[0]


def _deferred_softmaxes(index: GraphIndex) -> list[onnx.NodeProto]:
    """A virtual ``Softmax(axis)`` with output ``exp(x)`` per ``Div(sum(exp(x) * v), sum(exp(x), axes=[axis]))``."""
    found, seen = [], set()
    for node in index.nodes:
        if node.op_type != "Div" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        exp = exp_sum_divisor(index, node.input[1])
        if exp is None or exp.output[0] in seen or _through_casts(index, node.input[0]) is exp:
            continue
        seen.add(exp.output[0])
        total = _through_casts(index, node.input[1], BROADCASTS)
        found.append(oh.make_node("Softmax", [_unshifted(index, exp.input[0])], [exp.output[0]],
                                  name=exp.name or exp.output[0],
                                  axis=int(index.int_list(total, 1, "axes")[0])))
    return found


def handwritten_softmaxes(index: GraphIndex) -> list[onnx.NodeProto]:
    """The virtual Softmaxes of both spellings."""
    return [*_quotient_softmaxes(index), *_deferred_softmaxes(index)]


def _quotient_softmaxes(index: GraphIndex) -> list[onnx.NodeProto]:
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
        found.append(oh.make_node("Softmax", [_unshifted(index, exp.input[0])], [node.output[0]],
                                  name=node.name or node.output[0],
                                  axis=int(axes[0])))
    return found
