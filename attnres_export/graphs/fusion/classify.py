"""What a Softmax that no pattern fuses is: attention over tokens, or something else.

Softmaxes that no pattern takes as its kind of site are told apart here, so that the report does not call an
attention layer a rejected aggregation. Attention: the logits come from a product of two activations (Q K^T) and
the weights multiply another activation (P V). Anything else is "other". Which values are activations (depend on a
graph input) is shared by every pattern.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import onnx

from attnres_export.graphs.fusion.graph import GraphIndex

ATTENTION, OTHER = "attention", "other softmax"
PRODUCTS = {"MatMul", "Einsum", "Gemm"}
PASS_THROUGH = {"Cast", "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Div", "Mul", "Add", "Sub",
                "Where", "Expand", "Neg"}
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


def is_attention(index: GraphIndex, softmax: onnx.NodeProto, activations: Callable[[str], bool]) -> bool:
    """Do the logits come from a product of two activations and the weights multiply another activation?"""
    def two_activations(node: onnx.NodeProto) -> bool:
        return sum(activations(i) for i in node.input if i) >= 2

    return any(map(two_activations, _products_behind(index, softmax.input[0]))) and \
        any(map(two_activations, _products_after(index, softmax.output[0])))


def activations(index: GraphIndex) -> _Activations:
    return _Activations(index)
