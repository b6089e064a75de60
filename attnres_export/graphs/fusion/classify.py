"""What a Softmax that fusion did not match is: attention over tokens, or something else.

A Softmax whose weights are traced to a stack of separate tensors is a depth aggregation whatever happens to it
next (match.py); the others are told apart here so that the report does not call an attention layer a rejected
aggregation. Attention: the logits come from a product of two activations (Q K^T) and the weights multiply
another activation (P V). Anything else is "other".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import onnx

from attnres_export.graphs.fusion.graph import GraphIndex

DEPTH, ATTENTION, OTHER = "depth aggregation", "attention", "other softmax"
RESIDUAL = "residual-score attention"
"""Attention whose logits add the previous layer's scores (RealFormer): residual_scores.py, not this module."""
PRODUCTS = {"MatMul", "Einsum", "Gemm"}
PASS_THROUGH = {"Cast", "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Div", "Mul", "Add", "Sub",
                "Where", "Expand", "Neg"}
STACKS = {"Concat", "ConcatFromSequence", "ScatterElements", "ScatterND"}
MAX_STEPS = 16


class _Activations:
    """Which values depend on a graph input (memoized walk towards the inputs)."""

    def __init__(self, index: GraphIndex) -> None:
        self.index = index
        self.inputs = {i.name for i in index.model.graph.input} - set(index.initializers)
        self.memo: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        pending = [name]
        while pending:
            current = pending[-1]
            if current in self.memo:
                pending.pop()
                continue
            node = self.index.producer.get(current)
            if current in self.inputs or node is None:
                self.memo[current] = current in self.inputs
                pending.pop()
                continue
            unknown = [i for i in node.input if i and i not in self.memo]
            if unknown:
                pending.extend(unknown)
                continue
            self.memo[current] = any(self.memo.get(i, False) for i in node.input if i)
            pending.pop()
        return self.memo[name]


def _products_behind(index: GraphIndex, name: str) -> list[onnx.NodeProto]:
    """Products (MatMul/Einsum/Gemm) that ``name`` is computed from through element-wise and shape ops."""
    return _products_reached(name, lambda t: [n for n in [index.producer.get(t)] if n is not None],
                             lambda node: node.input)


def _products_after(index: GraphIndex, name: str) -> list[onnx.NodeProto]:
    """Products that take ``name`` through element-wise and shape ops."""
    return _products_reached(name, lambda t: index.consumers.get(t, []), lambda node: node.output)


def _products_reached(name: str, neighbours: Callable[[str], Iterable[onnx.NodeProto]],
                      onward: Callable[[onnx.NodeProto], Iterable[str]]) -> list[onnx.NodeProto]:
    """The walk both directions share: stop at products, pass through ``PASS_THROUGH`` ops, at most
    ``MAX_STEPS`` nodes."""
    found, seen, pending = [], set(), [name]
    while pending and len(seen) < MAX_STEPS:
        for node in neighbours(pending.pop()):
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type in PRODUCTS:
                found.append(node)
            elif node.op_type in PASS_THROUGH:
                pending.extend(t for t in onward(node) if t)
    return found


def classify_unmatched(index: GraphIndex, softmax: onnx.NodeProto, activations: _Activations) -> str:
    """``attention``, ``depth aggregation`` (a stack the matcher could not trace) or ``other softmax``."""
    def two_activations(node: onnx.NodeProto) -> bool:
        return sum(activations(i) for i in node.input if i) >= 2

    if any(map(two_activations, _products_behind(index, softmax.input[0]))) and \
            any(map(two_activations, _products_after(index, softmax.output[0]))):
        return ATTENTION
    stacked = index.producer.get(softmax.input[0])
    for _ in range(MAX_STEPS):
        if stacked is None:
            break
        if stacked.op_type in STACKS:
            return DEPTH
        stacked = index.producer.get(stacked.input[0]) if stacked.input else None
    return OTHER


def activations(index: GraphIndex) -> _Activations:
    return _Activations(index)
