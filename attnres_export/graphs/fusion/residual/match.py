"""Structure of attention softmaxes, and which of them carry residual scores (RealFormer).

Every Softmax whose logits come, through element-wise ops, from a product of two activations (``Q K^T``: a MatMul
with ``k^T``, or an Einsum ``bhqd,bhkd->bhqk`` in any layout, layout.py) and whose weights multiply another activation
(``P V``: a MatMul, or an Einsum ``bhqk,bhkd->bhqd`` in the scores' layout) over the key axis is read as an attention
site: the path of tensors from the product
to the softmax input, the operands added or multiplied on the way, and the ``P V`` product. A site carries residual
scores when an operand on its path is (up to element-wise ops with constants) a tensor on another site's path: the
previous layer's scores. Whether the site then computes ResidualScoreAttention is decided in scores.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.graphs.fusion.residual.layout import Layout, einsum_layout, query_key_roles
from attnres_export.graphs.fusion.resolve import strip_casts
from attnres_export.ops.onnx_nodes import attribute

ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Cast", "Identity", "Where", "Neg"}
"""Ops a score path may pass through between ``Q K^T`` and the softmax (or between the softmax and ``P V``)."""
PLUMBING = {"Cast", "Identity"}
MAX_STEPS = 64
"""Most tensors a backward or forward walk visits: a score path is a handful of ops."""
CARRY_STEPS = 8
"""Most element-wise ops with constants between another site's scores and the operand that reads them."""

DependsOnInput = Callable[[str], bool]


@dataclass
class Operand:
    """An input of a path node that is not the path itself: a constant, a mask, or another layer's scores."""

    node: onnx.NodeProto
    name: str
    constant: bool
    carried: str | None = None
    """The tensor on another site's path that this operand is computed from, when it is one."""


@dataclass
class AttentionSite:
    softmax: onnx.NodeProto
    product: onnx.NodeProto
    """``Q K^T``: a MatMul of ``q`` and ``k^T``, or an Einsum of ``q`` and ``k``."""
    path: list[str]
    """Tensors from the product's output to the softmax input, in order."""
    weighted: onnx.NodeProto
    """``P V``: the product taking the softmax result (through casts and after-softmax ops) and ``v``."""
    before: list[Operand] = field(default_factory=list)
    """Operands of the path nodes (product to softmax)."""
    after: list[Operand] = field(default_factory=list)
    """Operands of element-wise ops between the softmax and ``P V`` (RealFormer has none)."""
    layout: Layout | None = None
    """How the einsums lay out the axes, when not as ``[B, H, T, d]`` (layout.py)."""

    @property
    def key_transposed(self) -> bool:
        """Does the product take ``k^T`` (MatMul) rather than ``k`` (Einsum)?"""
        return self.product.op_type == "MatMul"

    def path_nodes(self, index: GraphIndex) -> list[onnx.NodeProto]:
        return [index.producer[t] for t in self.path[1:]]


def attention_sites(index: GraphIndex, softmaxes: list[onnx.NodeProto],
                    depends_on_input: DependsOnInput) -> list[AttentionSite]:
    """Every softmax of ``softmaxes`` that has the shape of attention, with its operands' carried scores set."""
    sites = [s for s in (_read(index, node, depends_on_input) for node in softmaxes) if s is not None]
    owner = {t: site for site in sites for t in (*site.path, site.softmax.output[0])}
    for site in sites:
        for operand in (*site.before, *site.after):
            if not operand.constant:
                operand.carried = _carried_from(index, operand.name, owner, site, depends_on_input)
    return sites


def owner_of(sites: list[AttentionSite]) -> dict[str, AttentionSite]:
    """Path tensor -> the site whose path holds it."""
    return {t: site for site in sites for t in site.path}


def _read(index: GraphIndex, softmax: onnx.NodeProto, depends_on_input: DependsOnInput) -> AttentionSite | None:
    if softmax.output[0] not in index.consumers:
        return None
    path = _path_to_product(index, softmax.input[0], depends_on_input)
    if path is None:
        return None
    weighted = _weighting_product(index, softmax.output[0], depends_on_input)
    if weighted is None:
        return None
    product, axis = index.producer[path[0]], attribute(softmax, "axis", -1)
    layout = None
    if product.op_type == "MatMul":
        standard = weighted[0].op_type == "MatMul" or _einsum_is(weighted[0], "wxyu,wxuz->wxyz")
        if not standard or axis not in (-1, 3):
            return None
    else:
        layout = einsum_layout(product, weighted[0])
        if layout is None or axis % 4 != layout.key_axis:
            return None
    before = _operands([index.producer[t] for t in path[1:]], set(path), depends_on_input)
    return AttentionSite(softmax, product, path, weighted[0], before, weighted[1],
                         None if layout is None or layout.identity else layout)


def _two_activations(node: onnx.NodeProto, depends_on_input: DependsOnInput) -> bool:
    """``Q K^T`` of two activations."""
    shaped = node.op_type == "MatMul" or (node.op_type == "Einsum" and query_key_roles(node) is not None)
    return shaped and len(node.input) == 2 and all(depends_on_input(i) for i in node.input)


def _einsum_is(node: onnx.NodeProto, pattern: str) -> bool:
    """Is the Einsum's equation ``pattern`` with its letters renamed (distinct letters stay distinct)?"""
    equation = (attribute(node, "equation") or b"").decode().replace(" ", "")
    if len(equation) != len(pattern):
        return False
    mapping: dict[str, str] = {}
    for mine, theirs in zip(equation, pattern, strict=True):
        if (mine in ",->") != (theirs in ",->") or (mine in ",->" and mine != theirs):
            return False
        if mine not in ",->" and mapping.setdefault(mine, theirs) != theirs:
            return False
    return len(set(mapping.values())) == len(mapping)


def _path_to_product(index: GraphIndex, logits: str, depends_on_input: DependsOnInput) -> list[str] | None:
    """Tensors from the latest ``Q K^T`` product behind ``logits`` (through element-wise ops) to ``logits``.

    The latest, because the previous layer's scores lead back to the previous layer's product too."""
    child: dict[str, str] = {logits: ""}
    pending, products = [logits], []
    while pending and len(child) < MAX_STEPS:
        tensor = pending.pop(0)
        node = index.producer.get(tensor)
        if node is None:
            continue
        if _two_activations(node, depends_on_input):
            products.append(tensor)
        elif node.op_type in ELEMENTWISE:
            for name in node.input:
                if name and name not in child and depends_on_input(name):
                    child[name] = tensor
                    pending.append(name)
    if not products:
        return None
    raw = max(products, key=lambda t: index.position[id(index.producer[t])])
    path = [raw]
    while path[-1] != logits:
        path.append(child[path[-1]])
    return path


def _weighting_product(index: GraphIndex, weights: str, depends_on_input: DependsOnInput
                       ) -> tuple[onnx.NodeProto, list[Operand]] | None:
    """The product (a MatMul or an Einsum, read by ``_read``) that takes ``weights`` as its left operand and an
    activation ``v``, and the operands of the element-wise ops met on the way."""
    tensor, nodes = weights, []
    for _ in range(MAX_STEPS):
        users = index.consumers.get(tensor, [])
        if len(users) != 1:
            return None
        node = users[0]
        product = node.op_type in ("MatMul", "Einsum") and len(node.input) == 2
        if product and node.input[0] == tensor and depends_on_input(node.input[1]):
            return node, _operands(nodes, {weights, *(n.output[0] for n in nodes)}, depends_on_input)
        if node.op_type not in ELEMENTWISE:
            return None
        nodes.append(node)
        tensor = node.output[0]
    return None


def _operands(nodes: list[onnx.NodeProto], path: set[str], depends_on_input: DependsOnInput) -> list[Operand]:
    return [Operand(node, name, not depends_on_input(name))
            for node in nodes for name in node.input if name and name not in path]


def _carried_from(index: GraphIndex, name: str, owner: dict[str, AttentionSite], reader: AttentionSite,
                  depends_on_input: DependsOnInput) -> str | None:
    """The tensor of another site's path (or its softmax result) that ``name`` is, or is computed from by
    element-wise ops whose other inputs are constants."""
    for _ in range(CARRY_STEPS):
        if name in owner and owner[name] is not reader:
            return name
        node = index.producer.get(name)
        if node is None or node.op_type not in ELEMENTWISE:
            return None
        live = [i for i in node.input if i and depends_on_input(i)]
        if len(live) != 1:
            return None
        name = live[0]
    return None


def operands_of(site: AttentionSite, index: GraphIndex, values: dict[str, np.ndarray]) -> tuple[str, str, str]:
    """``(q, k^T or k, v)`` of the site before widening casts (kept when stripping would give them different
    types)."""
    raw = [site.product.input[0], site.product.input[1], site.weighted.input[1]]
    stripped = [strip_casts(index, name, values) for name in raw]
    for names in (stripped, raw):
        if len({values[n].dtype for n in names}) == 1:
            return names[0], names[1], names[2]
    raise Rejected("q, k and v have different types")
