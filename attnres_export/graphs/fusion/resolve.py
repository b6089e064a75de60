"""Tracing one slot of a stacked tensor back to the separate tensor that was stacked there.

A stack is ``Concat``/``Unsqueeze`` (``torch.stack``/``torch.cat``), possibly reshaped, transposed, sliced, cast to
float32, or built by writing into a pre-allocated buffer or bank: ``ScatterElements`` with one index
(``buf[i] = x``, ``bank[:, i].copy_(x)``) and ``ScatterND`` over rows of the first axis (slice assignment
``bank[:, i:i+1] = x``, or a bank's rows replaced by an updated view of them). A slice of a bank looks at a window
of the other axes, followed down to the tensors written there. The fused node takes the separate tensors, so the
stack itself can be dropped when nothing else reads it.
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


Window = tuple["tuple[int, int] | None", ...]
"""Per axis of a tensor, the ``[start, stop)`` range looked at (None: all of it); the slot axis is always None."""


def resolve_slot(index: GraphIndex, values: Mapping[str, np.ndarray], name: str, axis: int, k: int,
                 slots: dict[str, np.ndarray] | None = None, depth: int = 0,
                 window: Window | None = None) -> str | None:
    """The separate tensor stored at position ``k`` of ``axis`` of ``name`` (within ``window`` on the other axes:
    a slice of a larger bank), or None when it cannot be traced.

    A slot of a constant (a static export folds ``torch.zeros_like`` partial sources into the stacked
    initializer) is no tensor of the graph: with ``slots`` given, its value is stored there under a new name,
    which is returned (rewrite.py makes it an initializer)."""
    value = values.get(name)
    node = index.producer.get(name)
    if value is None or depth > MAX_DEPTH:
        return None
    rank = value.ndim
    axis %= rank
    window = _normalized(window, value.shape, axis)
    if slots is not None and index.constant(name) is not None:
        return _constant_slot(value, name, axis, k, window, slots)
    if node is None or node.domain not in ("", "ai.onnx"):
        return None

    def again(tensor: str, new_axis: int, new_k: int, new_window: Window | None = None) -> str | None:
        return resolve_slot(index, values, tensor, new_axis, new_k, slots, depth + 1, new_window)

    op, first = node.op_type, node.input[0] if node.input else ""
    if op == "Identity" or (op == "Cast" and widening_cast(node, values)):
        return again(first, axis, k, window)
    if op == "Unsqueeze":
        axes = sorted(a % rank for a in index.int_list(node, 1, "axes") or [])
        if axis in axes:
            return first if k == 0 and len(axes) == 1 and _whole(window) else None
        return again(first, axis - sum(a < axis for a in axes), k,
                     tuple(w for a, w in enumerate(window) if a not in axes))
    if op == "Squeeze":
        in_rank = values[first].ndim if first in values else None
        axes = index.int_list(node, 1, "axes")
        if in_rank is None or axes is None:
            return None
        kept = [a for a in range(in_rank) if a not in {x % in_rank for x in axes}]
        inner: list = [None] * in_rank
        for out_axis, in_axis in enumerate(kept):
            inner[in_axis] = window[out_axis]
        return again(first, kept[axis], k, tuple(inner))
    if op == "Transpose":
        perm = attribute(node, "perm") or list(reversed(range(rank)))
        inner = [None] * rank
        for out_axis, in_axis in enumerate(perm):
            inner[in_axis] = window[out_axis]
        return again(first, perm[axis], k, tuple(inner))
    if op == "Concat":
        if attribute(node, "axis") % rank != axis:
            return None
        offset = 0
        for part in node.input:
            size = values[part].shape[axis] if part in values else None
            if size is None:
                return None
            if k < offset + size:
                return again(part, axis, k - offset, window)
            offset += size
        return None
    if op == "Slice":
        return _through_slice(index, values, node, axis, k, window, again)
    if op == "ScatterElements":
        return _through_scatter(index, values, node, axis, k, window, again)
    if op == "ScatterND":
        return _through_scatter_nd(index, values, node, axis, k, window, again)
    if op == "Reshape" and _whole(window):
        return _through_reshape(values, node, value.shape, axis, k, again)
    return None


def _normalized(window: Window | None, shape: tuple[int, ...], axis: int) -> Window:
    """``window`` with ranges that cover their whole axis (and the slot axis) written as None."""
    if window is None:
        return (None,) * len(shape)
    return tuple(None if a == axis or w is None or w == (0, shape[a]) else w for a, w in enumerate(window))


def _whole(window: Window) -> bool:
    return all(w is None for w in window)


def _span(window: Window, axis: int, shape: tuple[int, ...]) -> tuple[int, int]:
    return window[axis] or (0, shape[axis])


def _constant_slot(value: np.ndarray, name: str, axis: int, k: int, window: Window,
                   slots: dict[str, np.ndarray]) -> str:
    """A slot of a constant stored in ``slots`` under a new name."""
    piece = np.take(np.asarray(value), k, axis=axis)
    cut = [slice(*w) if w else slice(None) for a, w in enumerate(window) if a != axis]
    slot = f"{name}/slot_{axis}_{k}" + ("" if _whole(window) else f"_{'_'.join(f'{c.start}-{c.stop}' for c in cut)}")
    slots[slot] = piece[tuple(cut)]
    return slot


def _index_values(index: GraphIndex, values: Mapping[str, np.ndarray], name: str) -> np.ndarray | None:
    """The indices of a scatter: a constant, an Expand of one, or (computed from shapes) their captured value."""
    indices = index.constant(name)
    expand = index.producer.get(name)
    if indices is None and expand is not None and expand.op_type == "Expand":
        indices = index.constant(expand.input[0])
    if indices is None:
        indices = values.get(name)
    return None if indices is None else np.asarray(indices)


def _ints(index: GraphIndex, values: Mapping[str, np.ndarray], node: onnx.NodeProto, position: int,
          attr: str) -> list[int] | None:
    """A Slice parameter: a constant, or one computed from shapes (``bank[: b * t]``), as the reference run saw it."""
    found = index.int_list(node, position, attr)
    if found is None and len(node.input) > position and node.input[position] in values:
        found = [int(v) for v in np.asarray(values[node.input[position]]).ravel()]
    return found


def _through_slice(index, values, node, axis, k, window, again):
    source = values.get(node.input[0])
    starts, ends = _ints(index, values, node, 1, "starts"), _ints(index, values, node, 2, "ends")
    if source is None or starts is None or ends is None:
        return None
    axes = _ints(index, values, node, 3, "axes") or list(range(len(starts)))
    steps = _ints(index, values, node, 4, "steps") or [1] * len(starts)
    inner = list(window)
    offset = 0
    for start, end, ax, step in zip(starts, ends, axes, steps, strict=True):
        ax %= source.ndim
        dim = source.shape[ax]
        start = min(max(start + dim if start < 0 else start, 0), dim)
        end = min(max(end + dim if end < 0 else end, 0), dim)
        if step != 1:
            return None
        if ax == axis:
            offset = start
        else:
            low, high = window[ax] or (0, end - start)
            inner[ax] = (start + low, start + high)
    return again(node.input[0], axis, offset + k, tuple(inner))


def _through_scatter(index, values, node, axis, k, window, again):
    """``ScatterElements`` writing one slot of ``axis`` (``buf[i] = x``, ``buf[:, i].copy_(x)``)."""
    data, updates = values.get(node.input[0]), values.get(node.input[2])
    if data is None or updates is None or attribute(node, "axis", 0) % data.ndim != axis:
        return None
    if attribute(node, "reduction", b"none") not in (b"none", "none") or updates.shape[axis] != 1:
        return None
    indices = _index_values(index, values, node.input[1])
    if indices is None or np.unique(indices).size != 1:
        return None
    if int(np.ravel(indices)[0]) % data.shape[axis] != k:
        return again(node.input[0], axis, k, window)
    covered = all(_span(window, a, data.shape)[1] <= updates.shape[a] for a in range(data.ndim) if a != axis)
    return again(node.input[2], axis, 0, window) if covered else None


def _through_scatter_nd(index, values, node, axis, k, window, again):
    """``ScatterND`` writing whole rows of the first axis (indices ``[m, 1]``): ``bank[i:j] = x`` along it, or a
    bank's rows replaced by an updated view of them (an in-place ``copy_`` into a slice of a buffer)."""
    data = values.get(node.input[0])
    indices = _index_values(index, values, node.input[1])
    if data is None or indices is None or indices.ndim != 2 or indices.shape[1] != 1:
        return None
    if attribute(node, "reduction", b"none") not in (b"none", "none"):
        return None
    rows = [int(r) % data.shape[0] for r in indices[:, 0]]
    if len(set(rows)) != len(rows):
        return None
    if axis == 0:
        return again(node.input[2], 0, rows.index(k), window) if k in rows else again(node.input[0], 0, k, window)
    low, high = _span(window, 0, data.shape)
    looked_at, stored = range(low, high), set(rows)
    written = [r for r in looked_at if r in stored]
    if not written:
        return again(node.input[0], axis, k, window)
    first = rows.index(low) if low in stored else -1
    if len(written) != len(looked_at) or rows[first: first + len(looked_at)] != list(looked_at):
        return None
    return again(node.input[2], axis, k, ((first, first + len(looked_at)), *window[1:]))


def _through_reshape(values, node, out_shape, axis, k, again):
    """The axis the slot came from, or, for a unit axis the Reshape added, its input: a tensor whose rows (the last
    axis kept) are the slot's rows in order, e.g. ``[B, T, D]`` written into a ``[B*T, 1, D]`` view of a bank."""
    source = values.get(node.input[0])
    if source is None:
        return None
    before, size, after = math.prod(out_shape[:axis]), out_shape[axis], math.prod(out_shape[axis + 1:])
    for a in range(source.ndim):
        if math.prod(source.shape[:a]) == before and source.shape[a] == size \
                and math.prod(source.shape[a + 1:]) == after:
            return again(node.input[0], a, k)
    if size == 1 and k == 0 and axis < len(out_shape) - 1 and source.shape[-1] == out_shape[-1] \
            and source.size == math.prod(out_shape):
        return node.input[0]
    return None
