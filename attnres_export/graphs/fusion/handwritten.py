"""Softmaxes written out by hand: ``exp(x) / sum(exp(x))`` (optionally ``x - max(x)`` first), as some
implementations write the depth softmax. Each is presented to the matcher as a Softmax node that is not in the
graph: its input is the exponent's argument, its output the quotient, its axis the summed axis. When the site is
fused, the hand-written nodes only fed the old subgraph and dead-code elimination removes them.

An online softmax divides after the weighted sum instead: ``sum(exp(x) * v) / sum(exp(x))``. Its virtual
Softmax outputs the unnormalized ``exp(x)``; the matcher follows the weighted sum through that division
(match.py). A phase 1 of two-phase Block AttnRes may keep both sums apart, unnormalized, for its merge with the
block's partial to divide: an Exp whose sum is taken is anchored too, its weighted sum normalized by that sum
when the merge is looked for (merge.py)."""

from __future__ import annotations

import onnx
from onnx import helper as oh

from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.ops.onnx_nodes import attribute

BROADCASTS = ("Cast", "Identity", "Unsqueeze", "Reshape", "Expand")
"""Ops between a sum of exponentials and the division by it (keepdims=0 sums are unsqueezed back)."""


def through_casts(index: GraphIndex, name: str, ops: tuple[str, ...] = ("Cast", "Identity")) -> onnx.NodeProto | None:
    """The producer of ``name`` behind any chain of ``ops``."""
    node = index.producer.get(name)
    while node is not None and node.op_type in ops:
        node = index.producer.get(node.input[0])
    return node


def exp_sum_divisor(index: GraphIndex, name: str) -> onnx.NodeProto | None:
    """The Exp whose single-axis ReduceSum ``name`` is (through casts and unsqueezes), else None."""
    total = through_casts(index, name, BROADCASTS)
    if total is None or total.op_type != "ReduceSum" or len(index.int_list(total, 1, "axes") or []) != 1:
        return None
    exp = through_casts(index, total.input[0])
    return exp if exp is not None and exp.op_type == "Exp" else None


def _unshifted(index: GraphIndex, name: str) -> str:
    """``x`` for ``x - max(x)``: the same softmax, and logits that still say the score weight when there is one
    source (``x - max(x)`` is then 0)."""
    sub = index.producer.get(name)
    if sub is None or sub.op_type != "Sub":
        return name
    peak = through_casts(index, sub.input[1], BROADCASTS)
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
        if exp is None or exp.output[0] in seen or through_casts(index, node.input[0]) is exp:
            continue
        seen.add(exp.output[0])
        total = through_casts(index, node.input[1], BROADCASTS)
        found.append(oh.make_node("Softmax", [_unshifted(index, exp.input[0])], [exp.output[0]],
                                  name=exp.name or exp.output[0],
                                  axis=int(index.int_list(total, 1, "axes")[0])))
    return found


def handwritten_softmaxes(index: GraphIndex) -> list[onnx.NodeProto]:
    """The virtual Softmaxes of the three spellings (an Exp is anchored once, by the first that takes it)."""
    quotient, deferred = _quotient_softmaxes(index), _deferred_softmaxes(index)
    exps = [through_casts(index, index.producer[n.output[0]].input[0]) for n in quotient]
    taken = {id(node) for node in exps if node is not None} | {id(index.producer[n.output[0]]) for n in deferred}
    return [*quotient, *deferred, *_unnormalized_softmaxes(index, taken)]


def exp_sum(index: GraphIndex, exp_output: str) -> str | None:
    """The single-axis ReduceSum of ``exp_output`` (through casts), when an Exp's sum is taken apart."""
    for node in index.consumers.get(exp_output, []):
        users = [node]
        while users and users[0].op_type in ("Cast", "Identity"):
            users = index.consumers.get(users[0].output[0], [])
        for user in users:
            if user.op_type == "ReduceSum" and len(index.int_list(user, 1, "axes") or []) == 1:
                return user.output[0]
    return None


def _unnormalized_softmaxes(index: GraphIndex, taken: set[int]) -> list[onnx.NodeProto]:
    """A virtual ``Softmax(axis)`` with output ``exp(x)`` per Exp whose sum over ``axis`` is taken apart from the
    sum it weighs: a phase 1 kept unnormalized, ``(sum(exp(x) * v), max(x), sum(exp(x)))``, whose result is only
    normalized by the merge with the block's partial (merge.py)."""
    found = []
    for node in index.nodes:
        if node.op_type != "Exp" or node.domain not in ("", "ai.onnx") or id(node) in taken:
            continue
        total = exp_sum(index, node.output[0])
        if total is None or len(index.consumers.get(node.output[0], [])) < 2:
            continue
        found.append(oh.make_node("Softmax", [_unshifted(index, node.input[0])], [node.output[0]],
                                  name=node.name or node.output[0],
                                  axis=int(index.int_list(index.producer[total], 1, "axes")[0])))
    return found


def _quotient_softmaxes(index: GraphIndex) -> list[onnx.NodeProto]:
    """A virtual ``Softmax(axis)`` per ``Div(Exp(x), ReduceSum(Exp(x), axes=[axis], keepdims=1))``."""
    found = []
    for node in index.nodes:
        if node.op_type != "Div" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        exp, total = through_casts(index, node.input[0]), through_casts(index, node.input[1])
        if exp is None or total is None or exp.op_type != "Exp" or total.op_type != "ReduceSum":
            continue
        if through_casts(index, total.input[0]) is not exp or attribute(total, "keepdims", 1) != 1:
            continue
        axes = index.int_list(total, 1, "axes")
        if axes is None or len(axes) != 1:
            continue
        found.append(oh.make_node("Softmax", [_unshifted(index, exp.input[0])], [node.output[0]],
                                  name=node.name or node.output[0],
                                  axis=int(axes[0])))
    return found
