"""Putting verified ResidualScoreAttention nodes into the graph (docs/fusion.md#residual-attention-scores).

Each fused node takes over two tensors of the original graph: the attention output and the running score sum,
so the next layer's node reads the sum as its ``prev_scores`` by name. Where the graph multiplied by ``k^T``, the
node's ``k`` is a Transpose of it (folded into the Transpose that made ``k^T``, when there is one). The nodes are
written in the compact spelling of the ``tensorrt`` target (docs/op-set.md#residualscoreattention), the graph is
re-sorted topologically and dead-code elimination drops what only the old subgraphs used.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass

import onnx
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.errors import GraphError
from attnres_export.graphs.fusion.graph import GraphIndex, dead_code_elimination, subgraph_inputs
from attnres_export.graphs.fusion.residual.layout import Layout
from attnres_export.graphs.onnx_utils import copy_model, replace_nodes, set_domain_import, unique_namer
from attnres_export.ops.descriptors import OPS
from attnres_export.ops.onnx_nodes import Fresh, attribute
from attnres_export.ops.opset import DOMAIN, OPSET_VERSION, PLUGIN_NAMESPACE, PLUGIN_VERSION, RESIDUAL_ATTENTION

KEY_SWAP = [0, 1, 3, 2]
"""``k`` from ``k^T`` (and back): the last two axes swapped."""
MERGED_KEY_SWAP = [0, 2, 1]
"""The same for 3-D ``[B*H, T, d]`` heads."""


@dataclass
class ResidualReplacement:
    """One verified site: ``out`` and ``scores`` become the outputs of ResidualScoreAttention(q, k, v, prev, mask)."""

    name: str
    q: str
    key: str
    """``k^T`` when ``key_transposed`` (what a MatMul multiplies by), else ``k``."""
    key_transposed: bool
    v: str
    prev: str | None
    mask: str | None
    out: str
    scores: str
    scale: float
    divisor: float
    types: dict[str, int]
    """Element type of every tensor named above (the node needs float32 ``prev``/``mask`` and writes ``out`` in
    q's type and float32 ``scores``; Casts bridge the difference)."""
    heads_merged: bool = False
    """3-D heads ``[B*H, T, d]`` (``torch.bmm``): the node sees them with a leading unit axis (B = 1, H = B*H)."""
    mask_rank: int = 4
    layout: Layout | None = None
    """The einsums' layout when it is not ``[B, H, T, d]``: the node sees its tensors transposed (layout.py)."""

    @property
    def key_swap(self) -> list[int]:
        return MERGED_KEY_SWAP if self.heads_merged else KEY_SWAP


def fused_io(r: ResidualReplacement, inputs: list[str], outputs: list[str], fresh: Fresh
             ) -> tuple[list[str], list[str], list[onnx.NodeProto], list[onnx.NodeProto]]:
    """The node's inputs and outputs for ``r``'s tensors, and the nodes before and after it. 4-D heads in the node's
    layout are read as they are. 3-D heads ``[B*H, T, d]`` get a leading unit axis (Unsqueeze) and the outputs lose it
    (Squeeze), so they are read as B = 1, H = B*H (attention is the same per head either way). In another einsum
    layout, each input is transposed to the node's (a mask first given leading unit axes up to rank 4) and each
    output back."""
    if not r.heads_merged and r.layout is None:
        return inputs, outputs, [], []
    before, after = [], []

    def axes(count: int) -> str:
        name = fresh("axes")
        before.append(oh.make_node("Constant", [], [name], name=f"{r.name}/{name}",
                                   value=oh.make_tensor(name, TensorProto.INT64, [count], list(range(count)))))
        return name

    def then(nodes: list[onnx.NodeProto], op: str, inputs: list[str], output: str, **attrs) -> str:
        nodes.append(oh.make_node(op, inputs, [output], name=f"{r.name}/{output}", **attrs))
        return output

    ranks = (3, 3, 3, 3, r.mask_rank) if r.heads_merged else (4, 4, 4, 4, r.mask_rank)
    perms = r.layout.inputs if r.layout is not None else (None,) * 5
    lifted = []
    for name, rank, perm in zip(inputs, ranks, perms, strict=False):
        if name and rank < 4:
            name = then(before, "Unsqueeze", [name, axes(4 - rank)], fresh("heads"))
        if name and perm is not None:
            name = then(before, "Transpose", [name], fresh("layout"), perm=list(perm))
        lifted.append(name)
    if r.heads_merged:
        unit = axes(1)
        produced = [fresh("heads") for _ in outputs]
        for four, three in zip(produced, outputs, strict=True):
            then(after, "Squeeze", [four, unit], three)
        return lifted, produced, before, after
    produced = [fresh("layout") for _ in outputs]
    for node_output, graph_output, perm in zip(produced, outputs, (r.layout.out, r.layout.scores_back), strict=True):
        then(after, "Transpose", [node_output], graph_output, perm=list(perm))
    return lifted, produced, before, after


def attention_node(name: str, inputs: list[str], outputs: list[str], scale: float, divisor: float) -> onnx.NodeProto:
    """ResidualScoreAttention in the ONNX spelling: ``q, k, v, prev_scores, mask_bias``, ``""`` for absent ones."""
    while inputs and not inputs[-1]:
        inputs = inputs[:-1]
    return oh.make_node(RESIDUAL_ATTENTION, inputs, outputs, name=name, domain=DOMAIN, scale=float(scale),
                        logit_divisor=float(divisor), plugin_version=PLUGIN_VERSION,
                        plugin_namespace=PLUGIN_NAMESPACE)


def apply_residual_replacements(model: onnx.ModelProto, replacements: list[ResidualReplacement]) -> onnx.ModelProto:
    """A copy of ``model`` whose replaced tensors come from fused nodes; unused nodes are then removed."""
    out = copy_model(model)
    if not replacements:
        return out
    graph = out.graph
    index = GraphIndex(out)
    fresh = unique_namer(graph, "attnres_fusion")
    taken = {name: r for r in replacements for name in (r.out, r.scores)}
    as_float = {r.scores: fresh("scores") if r.types[r.scores] != TensorProto.FLOAT else r.scores
                for r in replacements}
    by_out = {r.out: r for r in replacements}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        fused = [by_out[o] for o in node.output if o in by_out]
        if not any(o in taken for o in node.output):
            nodes.append(node)
        elif len(node.output) > 1:
            for i, name in enumerate(node.output):
                if name in taken:
                    node.output[i] = fresh("unused")
            nodes.append(node)
        for r in fused:
            nodes.extend(_fused_nodes(index, r, fresh, as_float))
    replace_nodes(graph, topological_order(graph, nodes))
    set_domain_import(out, DOMAIN, OPSET_VERSION)
    dead_code_elimination(graph)
    return out


def _fused_nodes(index: GraphIndex, r: ResidualReplacement, fresh: Fresh,
                 as_float: dict[str, str]) -> list[onnx.NodeProto]:
    """The node of ``r`` and the Casts around it. ``as_float`` maps a tensor to its float32 version, shared by all
    sites: a half-precision running sum is read as the float32 ``scores`` output that it was cast from, and a
    half-precision mask is cast once."""
    nodes: list[onnx.NodeProto] = []

    def float_version(name: str | None) -> str:
        if not name or r.types[name] == TensorProto.FLOAT:
            return name or ""
        if name not in as_float:
            as_float[name] = fresh("as_float")
            nodes.append(oh.make_node("Cast", [name], [as_float[name]], name=f"{r.name}/{name}_as_float",
                                      to=TensorProto.FLOAT))
        return as_float[name]

    prev, mask = float_version(r.prev), float_version(r.mask)
    key = _key(index, r, fresh, nodes)
    out = r.out if r.types[r.out] == r.types[r.q] else fresh("out")
    inputs, outputs, before, after = fused_io(r, [r.q, key, r.v, prev, mask], [out, as_float[r.scores]], fresh)
    fused = attention_node(r.name, inputs, outputs, r.scale, r.divisor)
    OPS[RESIDUAL_ATTENTION].compact(fused)
    nodes.extend([*before, fused, *after])
    if out != r.out:
        nodes.append(oh.make_node("Cast", [out], [r.out], name=f"{r.name}/out_cast", to=r.types[r.out]))
    if as_float[r.scores] != r.scores:
        nodes.append(oh.make_node("Cast", [as_float[r.scores]], [r.scores], name=f"{r.name}/scores_cast",
                                  to=r.types[r.scores]))
    return nodes


def _key(index: GraphIndex, r: ResidualReplacement, fresh: Fresh, nodes: list[onnx.NodeProto]) -> str:
    """``k`` itself, or one Transpose: of the tensor that ``k^T`` was transposed from, or of ``k^T``."""
    if not r.key_transposed:
        return r.key
    source, perm = r.key, r.key_swap
    producer = index.producer.get(r.key)
    if producer is not None and producer.op_type == "Transpose":
        inner = attribute(producer, "perm") or list(reversed(range(len(perm))))
        source, perm = producer.input[0], [inner[p] for p in r.key_swap]
    if perm == sorted(perm):
        return source
    key = fresh("k")
    nodes.append(oh.make_node("Transpose", [source], [key], name=f"{r.name}/k", perm=perm))
    return key


def topological_order(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """``nodes`` sorted so that every value is produced before it is read, keeping the given order otherwise."""
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    users: dict[int, list[int]] = defaultdict(list)
    waiting = []
    for i, node in enumerate(nodes):
        needs = {producer[n] for n in (*node.input, *subgraph_inputs(node)) if n in producer} - {i}
        for j in needs:
            users[j].append(i)
        waiting.append(len(needs))
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for user in users[i]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) != len(nodes):
        raise GraphError(f"fusing residual attention left a cycle in graph {graph.name!r}")
    return [nodes[i] for i in order]
