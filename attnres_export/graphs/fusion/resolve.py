"""Tracing one slot of a stacked tensor back to the separate tensor that was stacked there.

A stack is ``Concat``/``Unsqueeze`` (``torch.stack``/``torch.cat``), possibly reshaped, transposed, sliced, cast to
float32, or built by writing into a pre-allocated buffer (``ScatterElements`` with a constant index). The fused
node takes the separate tensors, so the stack itself can be dropped when nothing else reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx

from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.ops.onnx_nodes import attribute

MAX_DEPTH = 512


def widening_cast(node: onnx.NodeProto, values: dict[str, np.ndarray]) -> bool:
    """A Cast that loses nothing: float to a float type at least as wide (e.g. bfloat16 -> float32)."""
    src, dst = values.get(node.input[0]), values.get(node.output[0])
    if src is None or dst is None:
        return False
    return (np.issubdtype(src.dtype, np.floating) and np.issubdtype(dst.dtype, np.floating)
            and dst.dtype.itemsize >= src.dtype.itemsize)


def strip_casts(index: GraphIndex, name: str, values: dict[str, np.ndarray]) -> str:
    """The tensor before any chain of widening Casts and Identities."""
    while (node := index.producer.get(name)) is not None and (
        node.op_type == "Identity" or (node.op_type == "Cast" and widening_cast(node, values))
    ):
        name = node.input[0]
    return name


def resolve_slot(index: GraphIndex, values: Mapping[str, np.ndarray], name: str, axis: int, k: int,
                 slots: dict[str, np.ndarray] | None = None, depth: int = 0) -> str | None:
    """The separate tensor stored at position ``k`` of ``axis`` of ``name``, or None when it cannot be traced.

    A slot of a constant (a static export folds ``torch.zeros_like`` partial sources into the stacked
    initializer) is no tensor of the graph: with ``slots`` given, its value is stored there under a new name,
    which is returned (rewrite.py makes it an initializer)."""
    value = values.get(name)
    node = index.producer.get(name)
    if value is not None and slots is not None and index.constant(name) is not None and depth <= MAX_DEPTH:
        slot = f"{name}/slot_{axis % value.ndim}_{k}"
        slots[slot] = np.take(np.asarray(value), k, axis=axis)
        return slot
    if value is None or node is None or depth > MAX_DEPTH or node.domain not in ("", "ai.onnx"):
        return None
    rank = value.ndim
    axis %= rank

    def again(tensor: str, new_axis: int, new_k: int) -> str | None:
        return resolve_slot(index, values, tensor, new_axis, new_k, slots, depth + 1)

    op, first = node.op_type, node.input[0] if node.input else ""
    if op == "Identity" or (op == "Cast" and widening_cast(node, values)):
        return again(first, axis, k)
    if op == "Unsqueeze":
        axes = sorted(a % rank for a in index.int_list(node, 1, "axes") or [])
        if axis in axes:
            return first if k == 0 and len(axes) == 1 else None
        return again(first, axis - sum(a < axis for a in axes), k)
    if op == "Squeeze":
        in_rank = values[first].ndim if first in values else None
        axes = index.int_list(node, 1, "axes")
        if in_rank is None or axes is None:
            return None
        kept = [a for a in range(in_rank) if a not in {x % in_rank for x in axes}]
        return again(first, kept[axis], k)
    if op == "Transpose":
        perm = attribute(node, "perm") or list(reversed(range(rank)))
        return again(first, perm[axis], k)
    if op == "Concat":
        if attribute(node, "axis") % rank != axis:
            return None
        offset = 0
        for part in node.input:
            size = values[part].shape[axis] if part in values else None
            if size is None:
                return None
            if k < offset + size:
                return again(part, axis, k - offset)
            offset += size
        return None
    if op == "Slice":
        return _through_slice(index, values, node, axis, k, again)
    if op == "ScatterElements":
        return _through_scatter(index, values, node, axis, k, again)
    if op == "Reshape":
        return _through_reshape(values, node, value.shape, axis, k, again)
    return None


def _through_slice(index, values, node, axis, k, again):
    source = values.get(node.input[0])
    starts, ends = index.int_list(node, 1, "starts"), index.int_list(node, 2, "ends")
    if source is None or starts is None or ends is None:
        return None
    axes = index.int_list(node, 3, "axes") or list(range(len(starts)))
    steps = index.int_list(node, 4, "steps") or [1] * len(starts)
    offset = 0
    for start, end, ax, step in zip(starts, ends, axes, steps, strict=True):
        ax %= source.ndim
        dim = source.shape[ax]
        start = min(max(start + dim if start < 0 else start, 0), dim)
        end = min(max(end + dim if end < 0 else end, 0), dim)
        if ax == axis and step == 1:
            offset = start
        elif not (step == 1 and start == 0 and end == dim):
            return None
    return again(node.input[0], axis, offset + k)


def _through_scatter(index, values, node, axis, k, again):
    if attribute(node, "axis", 0) % values[node.output[0]].ndim != axis or node.input[2] not in values:
        return None
    reduction = attribute(node, "reduction", b"none")
    if values[node.input[2]].shape[axis] != 1 or reduction not in (b"none", "none"):
        return None
    indices = index.constant(node.input[1])
    expand = index.producer.get(node.input[1])
    if indices is None and expand is not None and expand.op_type == "Expand":
        indices = index.constant(expand.input[0])
    if indices is None or np.unique(indices).size != 1:
        return None
    slot = int(np.ravel(indices)[0]) % values[node.output[0]].shape[axis]
    if slot == k:
        return again(node.input[2], axis, 0)
    return again(node.input[0], axis, k)


def _through_reshape(values, node, out_shape, axis, k, again):
    source = values.get(node.input[0])
    if source is None:
        return None
    before, size, after = math.prod(out_shape[:axis]), out_shape[axis], math.prod(out_shape[axis + 1:])
    for a in range(source.ndim):
        if math.prod(source.shape[:a]) == before and source.shape[a] == size \
                and math.prod(source.shape[a + 1:]) == after:
            return again(node.input[0], a, k)
    if size == 1 and k == 0 and tuple(source.shape) == tuple(out_shape[:axis]) + tuple(out_shape[axis + 1:]):
        return node.input[0]
    return None
