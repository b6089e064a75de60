"""Structure of one candidate site: from a Softmax to the sources it weighs and the weighted sum it produces.

Only the plumbing is matched here (which tensors are the sources, which tensor is the result); whether the
site computes AttnRes, and with which score weight and eps, is decided numerically (probe.py, verify.py).
"""

from __future__ import annotations

import math
from collections import ChainMap
from dataclasses import dataclass, field

import numpy as np
import onnx

from attnres_export.graphs.fusion.depth.constants import GraphConstants
from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.graphs.fusion.handwritten import exp_sum, exp_sum_divisor
from attnres_export.graphs.fusion.resolve import resolve_slot, strip_casts
from attnres_export.ops.onnx_nodes import attribute

PLUMBING = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Transpose", "Expand", "Identity", "Flatten"}
SLICING = {"Split", "Slice", "Gather"}
COMBINE = {"Mul", "MatMul", "Einsum"}
CONTRACTIONS = {"MatMul", "Einsum", "ReduceSum"}
OUTPUT_WINDOW = 64
"""How many nodes after the weighting nodes the weighted sum may take (per source)."""
QUERY_STEPS = 64
"""How many slicing and reshaping nodes after a batched weighted sum are looked through for each query's slice."""


@dataclass
class SiteMatch:
    """A Softmax whose result weighs ``sources`` (separate tensors, same shape) into ``output``."""

    softmax: onnx.NodeProto
    sources: list[str]
    output: str
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    """Sources that are slots of a stacked constant, by the new names they get (constants.py)."""
    normalizer: str | None = None
    """The sum of exponentials ``output`` is still to be divided by, for a phase 1 kept unnormalized
    (handwritten.py); its merge with the partial divides (merge.py)."""
    query: int | None = None
    """Which query the site is, when its softmax scores several at once (weights ``[S, n, ...]``, a weighted sum of
    the sources' shape with an axis of ``S`` more): ``output`` is the graph's slice for that query, while
    ``normalizer`` and the logits hold every query's (query_axes)."""


def query_axes(shape: tuple[int, ...], query: int, rows: int) -> list[int]:
    """The axes of an array of ``shape`` that can hold one value per query and row: longer than ``query``, and with
    ``rows`` values left without them."""
    size = math.prod(shape)
    return [a for a, n in enumerate(shape) if n > query and size // n == rows]


def match_sites(index: GraphIndex, softmax: onnx.NodeProto, values: dict[str, np.ndarray]) -> list[SiteMatch]:
    """The sources and output of the aggregation around ``softmax``, one match per query when it scores several;
    raises Rejected with the reason."""
    slots: dict[str, np.ndarray] = {}
    values = ChainMap(slots, values, GraphConstants(index))
    weights = values.get(softmax.output[0])
    if weights is None:
        raise Rejected("the softmax was not computed in the reference run")
    n = weights.shape[attribute(softmax, "axis", -1) % weights.ndim]
    combines = _weighting_nodes(index, softmax.output[0])
    if not combines:
        raise Rejected("the softmax result is not used as weights of a product (Mul, MatMul or Einsum)")
    if len(combines) == 1:
        try:
            sources = _stacked_sources(index, combines[0], n, values, slots)
        except Rejected:
            if n != 1:
                raise
            sources = [strip_casts(index, combines[0][1], values)]
    elif len(combines) == n:
        sources = [strip_casts(index, operand, values) for _, operand in combines]
    else:
        raise Rejected(f"the {n} softmax weights are used by {len(combines)} products")
    sources = _in_one_shape(index, sources, values)
    shapes = {values[s].shape for s in sources}
    if len(shapes) != 1 or len({values[s].dtype for s in sources}) != 1:
        raise Rejected("the sources differ in shape or type")
    producer = index.producer.get(softmax.output[0])
    unnormalized = producer is not None and producer.op_type == "Exp"
    constants = {s: slots[s] for s in sources if s in slots}
    matches = []
    for query, weighted in _weighted_sums(index, [node for node, _ in combines], next(iter(shapes)), values):
        output = weighted if query is not None else _through_deferred_division(index, weighted, softmax.output[0])
        normalizer = exp_sum(index, softmax.output[0]) if output == weighted and unnormalized else None
        if normalizer is None:
            output = _through_cast_back(index, output, values[sources[0]].dtype, values)
        matches.append(SiteMatch(softmax, list(sources), output, constants, normalizer, query))
    return matches


def _in_one_shape(index: GraphIndex, sources: list[str], values: ChainMap) -> list[str]:
    """The sources in one shape: a source that differs from the others only by a Reshape that keeps its rows
    (``x.reshape(b * t, d)`` before writing it into a token-major bank) is taken before that Reshape, when that gives
    every source the same shape."""
    if len({values[s].shape for s in sources}) == 1:
        return sources
    chains = [_reshaped_from(index, s, values) for s in sources]
    for shape in [values[name].shape for name in chains[0]]:
        picked = [next((name for name in chain if values[name].shape == shape), None) for chain in chains]
        if all(picked):
            return picked
    return sources


def _reshaped_from(index: GraphIndex, name: str, values: ChainMap) -> list[str]:
    """``name`` and the tensors it is a row-preserving Reshape of (same last axis, same size), nearest first."""
    chain = [name]
    while (node := index.producer.get(chain[-1])) is not None and node.op_type == "Reshape":
        before, after = values.get(node.input[0]), values[chain[-1]]
        if before is None or before.size != after.size or before.shape[-1:] != after.shape[-1:]:
            break
        chain.append(node.input[0])
    return chain


def _stacked_sources(index: GraphIndex, combine: tuple[onnx.NodeProto, str], n: int, values: ChainMap,
                     slots: dict[str, np.ndarray]) -> list[str]:
    node, operand = combine
    axis = _stack_axis(index, node, operand, n, values)
    sources = [resolve_slot(index, values, operand, axis, k, slots) for k in range(n)]
    if any(s is None for s in sources):
        raise Rejected("the weighted tensor could not be traced to separate source tensors (not a stack)")
    return sources


def _weighting_nodes(index: GraphIndex, weights: str) -> list[tuple[onnx.NodeProto, str]]:
    """Products that take the softmax result (through reshapes, casts and slices) and one other tensor."""
    derived, stack, found = {weights}, [weights], []
    while stack:
        tensor = stack.pop()
        for node in index.consumers.get(tensor, []):
            if node.op_type in PLUMBING | SLICING and node.input[0] == tensor:
                for out in node.output:
                    if out and out not in derived:
                        derived.add(out)
                        stack.append(out)
            elif node.op_type in COMBINE:
                others = [i for i in node.input if i not in derived]
                if len(others) != 1:
                    raise Rejected(f"{node.op_type} {node.name!r} multiplies the weights by {len(others)} tensors")
                if all(node is not seen for seen, _ in found):
                    found.append((node, others[0]))
    found.sort(key=lambda item: index.position[id(item[0])])
    return found


def _stack_axis(index: GraphIndex, node: onnx.NodeProto, operand: str, n: int, values: dict) -> int:
    """The axis of the stacked operand that the softmax weighs."""
    shape = values[operand].shape
    candidates = [a for a, size in enumerate(shape) if size == n]
    if len(candidates) > 1:
        candidates = [a for a in candidates if a in _contracted_axes(index, node, operand, values)]
    if len(candidates) != 1:
        raise Rejected(f"cannot tell which axis of {operand!r} holds the {n} sources")
    return candidates[0]


def _contracted_axes(index: GraphIndex, node: onnx.NodeProto, operand: str, values: dict) -> set[int]:
    rank = values[operand].ndim
    if node.op_type == "MatMul":
        return {rank - 2} if node.input[1] == operand else {rank - 1}
    if node.op_type == "Einsum":
        inputs, _, output = attribute(node, "equation").decode().replace(" ", "").partition("->")
        terms = inputs.split(",")
        mine = terms[list(node.input).index(operand)]
        others = set("".join(t for i, t in enumerate(terms) if node.input[i] != operand))
        return {a for a, letter in enumerate(mine) if letter in others and letter not in output}
    consumer = _single_consumer(index, node.output[0])
    while consumer is not None and consumer.op_type == "Cast":
        consumer = _single_consumer(index, consumer.output[0])
    if consumer is None or consumer.op_type != "ReduceSum":
        return set()
    out_rank = values[node.output[0]].ndim
    axes = index.int_list(consumer, 1, "axes") or []
    return {a % out_rank - (out_rank - rank) for a in axes}


def _single_consumer(index: GraphIndex, name: str) -> onnx.NodeProto | None:
    users = index.consumers.get(name, [])
    return users[0] if len(users) == 1 else None


def _weighted_sums(index: GraphIndex, combines: list[onnx.NodeProto], shape: tuple,
                   values: dict) -> list[tuple[int | None, str]]:
    """The first tensor after the products that depends on all of them and has the sources' shape, as
    ``[(None, it)]``; or, when a contraction first gives that shape with one axis more (a softmax scoring ``S``
    queries at once: each query is an aggregation of its own), ``(query, its slice)`` for every query the graph
    takes a slice for."""
    bits = {id(node): 1 << i for i, node in enumerate(combines)}
    full = (1 << len(combines)) - 1
    reach: dict[str, int] = {}
    start = min(index.position[id(node)] for node in combines)
    for node in index.nodes[start: start + OUTPUT_WINDOW * (len(combines) + 1)]:
        mask = bits.get(id(node), 0)
        for name in node.input:
            mask |= reach.get(name, 0)
        if not mask:
            continue
        for name in node.output:
            reach[name] = mask
            if mask != full or name not in values:
                continue
            if values[name].shape == shape:
                return [(None, name)]
            if node.op_type in CONTRACTIONS and (slices := _query_slices(index, name, shape, values)):
                return slices
    raise Rejected("no weighted sum of the sources' shape follows the products")


def _query_slices(index: GraphIndex, name: str, shape: tuple, values: dict) -> list[tuple[int, str]]:
    """Per query, the tensor the graph takes as its slice of the batched weighted sum ``name`` (``shape`` with one
    axis more, of the queries), found by value among the tensors sliced or reshaped from it; none when ``name`` is no
    such sum."""
    batched = np.asarray(values[name])
    axes = [a for a in range(batched.ndim)
            if batched.shape[a] > 1 and batched.shape[:a] + batched.shape[a + 1:] == shape]
    if batched.ndim != len(shape) + 1 or not axes:
        return []
    derived = _sliced_from(index, name, shape, values)
    for axis in axes:
        found: list[tuple[int, str]] = []
        for query in range(batched.shape[axis]):
            want = np.take(batched, query, axis=axis)
            taken = {t for _, t in found}
            hit = next((t for t in derived if t not in taken and np.array_equal(values[t], want)), None)
            if hit is not None:
                found.append((query, hit))
        if found:
            return found
    return []


def _sliced_from(index: GraphIndex, name: str, shape: tuple, values: dict) -> list[str]:
    """Tensors of ``shape`` computed from ``name`` by slicing and reshaping ops alone, in graph order."""
    found, seen, pending = [], set(), [name]
    while pending and len(seen) < QUERY_STEPS:
        tensor = pending.pop()
        for node in index.consumers.get(tensor, []):
            if id(node) in seen or node.op_type not in PLUMBING | SLICING or node.input[0] != tensor:
                continue
            seen.add(id(node))
            for out in node.output:
                if out in values:
                    (found if values[out].shape == shape else pending).append(out)
    return sorted(found, key=lambda t: index.position[id(index.producer[t])])


def _through_deferred_division(index: GraphIndex, name: str, weights: str) -> str:
    """The quotient when ``name`` is divided by the sum of the (unnormalized) ``weights``: an online softmax
    normalizes after the weighted sum (handwritten.py)."""
    consumer = _single_consumer(index, name)
    if consumer is not None and consumer.op_type == "Div" and consumer.input[0] == name:
        exp = exp_sum_divisor(index, consumer.input[1])
        if exp is not None and exp.output[0] == weights:
            return consumer.output[0]
    return name


def _through_cast_back(index: GraphIndex, name: str, dtype: np.dtype, values: dict) -> str:
    """Prefer the result after a lone Cast back to the storage type (float32 math in a half-precision model)."""
    consumer = _single_consumer(index, name)
    if values[name].dtype != dtype and consumer is not None and consumer.op_type == "Cast" \
            and consumer.output[0] in values and values[consumer.output[0]].dtype == dtype:
        return consumer.output[0]
    return name


STACKS = {"Concat", "ConcatFromSequence", "ScatterElements", "ScatterND"}
STACK_STEPS = 16


def logits_from_a_stack(index: GraphIndex, softmax: onnx.NodeProto) -> bool:
    """Are the logits computed (along first inputs) from a stack the matcher could not trace? Such a softmax is
    still a depth aggregation, reported unfused."""
    node = index.producer.get(softmax.input[0])
    for _ in range(STACK_STEPS):
        if node is None:
            return False
        if node.op_type in STACKS:
            return True
        node = index.producer.get(node.input[0]) if node.input else None
    return False
