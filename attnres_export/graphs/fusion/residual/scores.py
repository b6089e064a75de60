"""Finding the attention layers of a RealFormer written elsewhere and replacing each by one ResidualScoreAttention
node (docs/fusion.md#residual-attention-scores).

A layer is residual-score attention when the previous layer's scores are added to its logits (match.py),
or when its own scores are added so by the next layer (the first layer has no previous scores). Its score path
must then read as the op: ``scores = scale * (q @ k^T) + prev`` (the tensor the next layer reads, or the sum itself
in the last layer), then ``scores / divisor + mask``, the softmax over keys, and ``@ v``; every other op on the
path rejects the site with its reason. Scale and divisor are the path's scalar constants; verification
(verify.py) decides. Attention without residual scores is left to the depth-aggregation pass, which
reports it as attention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from attnres_export.graphs.fusion.context import FusionContext
from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.graphs.fusion.probe import ConstantOf
from attnres_export.graphs.fusion.residual.match import (
    PLUMBING,
    AttentionSite,
    Operand,
    attention_sites,
    operands_of,
    owner_of,
)
from attnres_export.graphs.fusion.residual.rewrite import ResidualReplacement
from attnres_export.graphs.fusion.residual.verify import element_types, verify_attention
from attnres_export.graphs.fusion.result import Replacement, site_label


@dataclass
class _Role:
    """How a site takes part in the running sum: the operand adding the previous scores, the tensor carried on."""

    prev: Operand | None = None
    carried: str | None = None
    problem: str = ""


@dataclass
class ResidualSite:
    anchor: onnx.NodeProto
    """The site's softmax."""
    attention: AttentionSite
    role: _Role
    name: str
    label: str


def residual_sites(context: FusionContext, softmaxes: Sequence[onnx.NodeProto]) -> list[ResidualSite]:
    """The attention sites among ``softmaxes`` that add another layer's scores or whose scores another layer adds
    (including those whose way of doing it is not ResidualScoreAttention: they are rejected with the reason)."""
    sites = attention_sites(context.index, list(softmaxes), context.depends_on_input)
    roles = _roles(sites)
    return [ResidualSite(site.softmax, site, roles[id(site)], f"attnres_fusion/residual_attention_{number}",
                         site_label(site.softmax))
            for number, site in enumerate(s for s in sites if id(s) in roles)]


def fuse_residual_site(context: FusionContext, site: ResidualSite) -> Replacement | Rejected:
    """The verified ResidualScoreAttention of ``site``, or why it is left alone."""
    try:
        plan = _plan(context.index, site.attention, site.role, context.values, context.types, context.constant_of,
                     site.name)
        verdict = verify_attention(context.index, plan, context.values, context.seed, context.numerics)
    except Rejected as exc:
        return exc
    if not verdict.ok:
        return Rejected(verdict.reason)
    return Replacement(plan, rel_l2=verdict.worst.rel_l2 if verdict.worst else None)


def _roles(sites: list[AttentionSite]) -> dict[int, _Role]:
    """The residual-score sites (by id) and their part in the running sum; sites without one are plain attention."""
    owner = owner_of(sites)
    roles: dict[int, _Role] = {}
    for site in sites:
        after = [o for o in site.after if o.carried]
        before = [o for o in site.before if o.carried]
        role = roles.setdefault(id(site), _Role())
        if after:
            role.problem = (f"another layer's scores or weights ({after[0].carried!r}) are combined with the "
                            f"probabilities after the softmax ({after[0].node.op_type}); residual scores are added "
                            "to the logits before it")
        elif len(before) > 1:
            role.problem = f"the logits read {len(before)} other layers' scores; a running sum reads one"
        elif before and before[0].node.op_type != "Add":
            role.problem = (f"the previous layer's scores {before[0].carried!r} enter the logits through "
                            f"{before[0].node.op_type}, not added; not residual attention scores")
        elif before:
            role.prev = before[0]
            provider = roles.setdefault(id(owner[before[0].carried]), _Role())
            if provider.carried not in (None, before[0].carried):
                provider.problem = (f"its scores are read at two points ({provider.carried!r} and "
                                    f"{before[0].carried!r}); a running sum is carried once")
            provider.carried = before[0].carried
    return {k: r for k, r in roles.items() if r.problem or r.prev or r.carried}


def _plan(index: GraphIndex, site: AttentionSite, role: _Role, values: dict[str, np.ndarray], types: dict[str, int],
          constant_of: ConstantOf, name: str) -> ResidualReplacement:
    """The replacement the site's structure gives, before verification; raises Rejected with the reason."""
    if role.problem:
        raise Rejected(role.problem)
    prev_node = role.prev.node if role.prev else None
    scores = role.carried or (prev_node.output[0] if prev_node is not None else site.path[-1])
    if scores not in site.path:
        raise Rejected(f"the carried scores {scores!r} are not on this layer's score path")
    scale, divisor, mask = _read_path(index, site, prev_node, site.path.index(scores), constant_of)
    q, key, v = operands_of(site, index, values)
    prev = role.prev.name if role.prev else None
    merged = _check_shapes(values, site, (q, key, v), prev, mask, values[site.path[0]].shape)
    if not (math.isfinite(scale) and math.isfinite(divisor) and divisor != 0):
        raise Rejected(f"scale {scale} and divisor {divisor} are not finite and non-zero")
    out = _through_cast_back(index, site.weighted.output[0], values[q].dtype, values)
    names = [n for n in (q, key, v, prev, mask, out, scores) if n]
    return ResidualReplacement(name, q, key, site.key_transposed, v, prev, mask, out, scores, scale, divisor,
                               element_types(names, types, values), merged,
                               values[mask].ndim if mask else 4, site.layout)


def _read_path(index: GraphIndex, site: AttentionSite, prev_node: onnx.NodeProto | None, at: int,
               constant_of: ConstantOf) -> tuple[float, float, str | None]:
    """``(scale, divisor, mask)`` of a score path whose carried scores are ``site.path[at]``."""
    prev_at = site.path.index(prev_node.output[0]) if prev_node is not None else 0
    if prev_at > at:
        raise Rejected(f"the carried scores {site.path[at]!r} are taken before the previous layer's are added: "
                       "not a running sum")
    scale, divisor, mask = 1.0, 1.0, None
    for position, node in enumerate(site.path_nodes(index), start=1):
        operand = next((o for o in site.before if o.node is node), None)
        if node.op_type in PLUMBING or node is prev_node:
            continue
        if node.op_type in ("Mul", "Div"):
            if prev_node is not None and prev_at < position <= at:
                raise Rejected(f"{node.op_type} {node.name!r} scales the previous layer's scores too before they "
                               "are carried; ResidualScoreAttention carries scale * q k^T + prev")
            if mask is not None:
                raise Rejected(f"the mask {mask!r} is scaled by {node.op_type} {node.name!r} after it is added; "
                               "ResidualScoreAttention adds the mask after the divisor")
            factor = _scalar_factor(node, operand, site.path[position - 1], constant_of)
            if position <= at:
                scale *= factor
            else:
                divisor /= factor
        elif node.op_type == "Add" and operand is not None and not operand.constant:
            if position <= at:
                raise Rejected(f"{operand.name!r} is added to the scores before they are carried to the next layer "
                               "(a mask would accumulate); ResidualScoreAttention carries scale * q k^T + prev and "
                               "adds the mask after")
            if mask is not None:
                raise Rejected(f"two tensors ({mask!r}, {operand.name!r}) are added to the logits; one mask is "
                               "handled")
            mask = operand.name
        elif node.op_type == "Where":
            raise Rejected(f"the logits are masked with Where {node.name!r} (masked_fill), not an additive mask; "
                           "not handled")
        else:
            what = f" {operand.name!r}" if operand is not None else ""
            raise Rejected(f"{node.op_type} {node.name!r}{what} on the score path is not part of "
                           "ResidualScoreAttention (scale * q k^T + prev, / divisor, + mask)")
    return scale, divisor, mask


def _scalar_factor(node: onnx.NodeProto, operand: Operand | None, path_in: str, constant_of: ConstantOf) -> float:
    """What a Mul or Div by a scalar constant multiplies the path by."""
    value = constant_of(operand.name) if operand is not None else None
    if value is None or value.size != 1 or value.dtype == np.bool_:
        what = "the path by itself" if operand is None else f"{operand.name!r}"
        raise Rejected(f"{node.op_type} {node.name!r} by {what}, which is not a scalar constant")
    if node.op_type == "Div" and node.input[0] != path_in:
        raise Rejected(f"Div {node.name!r} divides a constant by the scores")
    constant = float(np.asarray(value).astype(np.float64).ravel()[0])
    if constant == 0:
        raise Rejected(f"{node.op_type} {node.name!r} by zero")
    return constant if node.op_type == "Mul" else 1.0 / constant


def _check_shapes(values: dict[str, np.ndarray], site: AttentionSite, qkv: tuple[str, str, str], prev: str | None,
                  mask: str | None, scores: tuple[int, ...]) -> bool:
    """Do q, k, v fit ``softmax(q @ k^T) @ v`` with 4-D heads ``[B, H, T, d]`` (False; in an einsum's layout, once
    transposed there) or 3-D ``[B*H, T, d]`` (True, ``torch.bmm``)? Raises Rejected otherwise."""
    shapes = [values[n].shape for n in qkv]
    ranks = {len(s) for s in shapes}
    if len(ranks) != 1 or ranks.isdisjoint({3, 4}):
        raise Rejected(f"q, k and v are not 4-D [B, H, T, d] or 3-D [B*H, T, d] (ranks {[len(s) for s in shapes]})")
    if site.layout is not None:
        shapes = [tuple(shape[axis] for axis in perm) for shape, perm in zip(shapes, site.layout.inputs, strict=False)]
    q_shape, k_shape, v_shape = shapes
    if site.key_transposed:
        k_shape = (*k_shape[:-2], k_shape[-1], k_shape[-2])
    if q_shape[-1] != k_shape[-1] or k_shape[-2] != v_shape[-2]:
        raise Rejected(f"q {q_shape}, k {k_shape} and v {v_shape} do not fit softmax(q @ k^T) @ v")
    if prev is not None and values[prev].shape != scores:
        raise Rejected(f"the previous scores are {values[prev].shape}, not the full scores {scores}")
    if mask is not None and not _broadcasts(values[mask].shape, scores):
        raise Rejected(f"the mask {values[mask].shape} does not broadcast to the scores {scores}")
    return ranks == {3}


def _broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def _through_cast_back(index: GraphIndex, name: str, dtype: np.dtype, values: dict[str, np.ndarray]) -> str:
    """The attention output after a lone Cast back to q's type (float32 math in a half-precision model)."""
    users = index.consumers.get(name, [])
    if values[name].dtype != dtype and len(users) == 1 and users[0].op_type == "Cast" \
            and values.get(users[0].output[0], values[name]).dtype == dtype:
        return users[0].output[0]
    return name
