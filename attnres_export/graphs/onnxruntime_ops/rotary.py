"""Rotary position embeddings as ONNX Runtime's ``RotaryEmbedding`` contrib op (docs/onnxruntime-target.md).

The decoder graphs take cos and sin from ``position_ids`` at run time and apply them per layer, to the queries and
to the keys, as "rotate half" in standard ops, seven nodes each:

    first  = Slice(x, 0, D/2, axis -1)          x: [batch, heads, seq, D]  (or Split(x, [D/2, D/2], axis -1))
    second = Slice(x, D/2, end, axis -1)
    out    = Add(Mul(x, cos), Mul(Concat(Neg(second), first, axis -1), sin))   cos, sin: [batch, 1, seq, D]

``com.microsoft.RotaryEmbedding(x, position_ids, cos_cache, sin_cache)`` (``interleaved = 0``) computes the same
``x * cos + rotate_half(x) * sin`` reading row ``position_ids[b, s]`` of ``[max_positions, D/2]`` tables. The
tables are not rebuilt from a formula: the graph's own cos and sin are evaluated (the nodes between
``position_ids`` and them, extracted into a model of their own) at ``position_ids = arange(max_positions)[None]``,
so that whatever the graph computes (inverse frequencies of any rope type, yarn's attention scaling, a stored
table gathered by position) is what the op reads. An application is rewritten only when

- both operands and the rotated tensor match the pattern above exactly, with a last dimension ``D = 2 * half`` known
  from the graph's shapes and ``x`` laid out ``[batch, heads, seq, D]`` over ``position_ids``' ``[batch, seq]``;
- cos and sin are computed from one integer graph input and constants alone (no other input, no external weight
  unless ``data_dir`` is given), and evaluate to ``[1, 1, max_positions, D]`` whose two halves are equal (the
  ``Concat(freqs, freqs)`` layout), and, at a second probe of scattered positions ``[3, 5]``, to the rows of that
  table (a function of each position alone);
- ``x`` and the tables are float32. A float16 export computes rotary in float32 between Casts (``rotate`` in
  ``models/decoder/rope.py``), so its float32 region is rewritten and the Casts stay.

Anything else (partial rotary written around the op's ``rotary_embedding_dim``, interleaved pairs, halves that
differ, cos/sin reading another input, a position beyond a stored table) is left as it is. Position ids at or
beyond ``max_positions`` are outside the tables: the caller sizes them to the export's largest past + seq.

The node is written on the heads-first form it matched; the attention rewrite that runs after it
(``attention.py:_Flat``) writes it again on the packed ``[batch, seq, heads * head]`` projection that
GroupQueryAttention reads (the op takes both forms, its head size from the tables), or moves it into
GroupQueryAttention (``do_rotary``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper as oh
from onnx import numpy_helper
from onnx.external_data_helper import uses_external_data

from attnres_export.graphs.onnxruntime_ops.nodes import (
    MS_DOMAIN,
    Nodes,
    attr,
    constant_tensor,
    constant_value,
    declared_shapes,
    drop_dead_nodes,
    import_microsoft_domain,
    reads,
)

Feeds = dict[str, np.ndarray]
Run = Callable[[onnx.ModelProto, Feeds], Feeds]
"""Evaluate a small model: feeds in, every graph output out by name."""

_PROBE = np.array([[7, 0, 3, 3, 1], [2, 9, 4, 8, 6], [5, 1, 0, 9, 2]], np.int64)
"""Scattered positions (scaled into the table) at which cos/sin must be the table's rows."""
_AGREE = 1e-6
"""Largest difference, relative to the largest entry, between values that are one function of a position evaluated
twice (elementwise kernels may round their vectorised and scalar tails differently by an ulp)."""


@dataclass(frozen=True)
class _Application:
    add: onnx.NodeProto
    x: str
    cos: str
    sin: str


def rotary_embeddings(model: onnx.ModelProto, max_positions: int, run: Run | None = None,
                      data_dir: Path | None = None) -> int:
    """Rewrite ``model`` in place: each exact rotate-half application becomes one ``RotaryEmbedding`` node reading
    ``[max_positions, D/2]`` float32 ``cos_cache``/``sin_cache`` initializers (module docstring). ``run``
    evaluates the graph's cos/sin (default: ``onnx.reference``; pass ONNX Runtime's to take its Cos/Sin bit for
    bit); ``data_dir``: the folder of the model's external data files, read for the constants cos/sin come from.
    Returns how many applications were rewritten."""
    if max_positions < 1:
        raise ValueError(f"max_positions must be at least 1, got {max_positions}")
    graph = model.graph
    nodes = Nodes(graph)
    shapes = declared_shapes(graph)
    tables: dict[tuple[str, str], tuple[str, str] | None] = {}
    names: dict[bytes, tuple[str, str]] = {}
    position_inputs: dict[str, str] = {}
    rewritten: dict[str, str] = {}
    count = 0
    for add in [n for n in graph.node if n.op_type == "Add"]:
        found = _match(graph, nodes, shapes, add)
        if found is None:
            continue
        key = (found.cos, found.sin)
        if key not in tables:
            tables[key] = _tables(model, nodes, shapes, found, max_positions, run or _reference, data_dir, names)
        if tables[key] is None:
            continue
        position = _position_input(graph, nodes, found.cos)
        if position not in position_inputs:
            position_inputs[position] = _int64(graph, position)
        cos_cache, sin_cache = tables[key]
        graph.node.append(oh.make_node("RotaryEmbedding", [found.x, position_inputs[position], cos_cache, sin_cache],
                                       [add.output[0]], name=f"genai/rotary/{add.output[0]}", domain=MS_DOMAIN,
                                       interleaved=0))
        graph.node.remove(add)
        rewritten.update({found.cos: position, found.sin: position})
        count += 1
    if count:
        _read_shapes_from_positions(graph, rewritten)
        drop_dead_nodes(graph)
        import_microsoft_domain(model)
    return count


def _match(graph: onnx.GraphProto, nodes: Nodes, shapes: dict[str, list], add: onnx.NodeProto) -> _Application | None:
    muls = [nodes.producer(name) for name in add.input]
    if len(muls) != 2 or any(m is None or m.op_type != "Mul" for m in muls):
        return None
    for direct, rotated in (muls, muls[::-1]):
        for rot, sin in (rotated.input, rotated.input[::-1]):
            found = _rotate_half(graph, nodes, rot)
            if found is None or found[0] not in direct.input or sin == rot:
                continue
            x, half = found
            cos = direct.input[1] if direct.input[0] == x else direct.input[0]
            if cos != x and _laid_out(shapes, x, half, _position_input(graph, nodes, cos)):
                return _Application(add, x, cos, sin)
    return None


def _rotate_half(graph: onnx.GraphProto, nodes: Nodes, name: str) -> tuple[str, int] | None:
    """``(x, D/2)`` when ``name`` is ``Concat(Neg(x[..., D/2:]), x[..., :D/2], axis -1)``."""
    concat = nodes.producer(name)
    if concat is None or concat.op_type != "Concat" or len(concat.input) != 2 or attr(concat, "axis", 0) != -1:
        return None
    neg = nodes.producer(concat.input[0])
    if neg is None or neg.op_type != "Neg":
        return None
    second, first = nodes.producer(neg.input[0]), nodes.producer(concat.input[1])
    if first is None or second is None:
        return None
    if first.op_type == second.op_type == "Split" and first is second:
        return _halves_split(graph, nodes, first, concat.input[1], neg.input[0])
    if first.op_type == second.op_type == "Slice" and first.input[0] == second.input[0]:
        low, high = _slice(graph, nodes, first), _slice(graph, nodes, second)
        if low is None or high is None or low[0] != 0 or low[1] < 1 or high[0] != low[1]:
            return None
        half = low[1]
        return (first.input[0], half) if high[1] >= 2 * half else None  # the end is checked against D (_laid_out)
    return None


def _slice(graph: onnx.GraphProto, nodes: Nodes, node: onnx.NodeProto) -> tuple[int, int] | None:
    """``(start, end)`` of a Slice of the last axis with step 1 and non-negative constant bounds."""
    values = [constant_value(graph, nodes, name) if name else None for name in node.input[1:5]]
    values += [None] * (4 - len(values))
    starts, ends, axes, steps = values
    if starts is None or ends is None or axes is None or starts.size != 1 or ends.size != 1 or axes.size != 1:
        return None
    if int(axes.reshape(-1)[0]) not in (-1, 3) or (steps is not None and steps.reshape(-1).tolist() != [1]):
        return None
    start, end = int(starts.reshape(-1)[0]), int(ends.reshape(-1)[0])
    return (start, end) if start >= 0 and end >= 0 else None


def _halves_split(graph: onnx.GraphProto, nodes: Nodes, split: onnx.NodeProto, first: str,
                  second: str) -> tuple[str, int] | None:
    if list(split.output) != [first, second] or attr(split, "axis", 0) not in (-1, 3):
        return None
    sizes = constant_value(graph, nodes, split.input[1]) if len(split.input) > 1 and split.input[1] else None
    if sizes is not None:
        halves = sizes.reshape(-1).tolist()
        return (split.input[0], int(halves[0])) if len(halves) == 2 and halves[0] == halves[1] > 0 else None
    return (split.input[0], -1) if attr(split, "num_outputs", 2) == 2 and not attr(split, "split", []) else None


def _laid_out(shapes: dict[str, list], x: str, half: int, position: str | None) -> bool:
    """``x`` is ``[batch, heads, seq, 2 * half]`` over ``position``'s ``[batch, seq]`` (declared shapes)."""
    dims, ids = shapes.get(x), shapes.get(position) if position else None
    if dims is None or ids is None or len(dims) != 4 or len(ids) != 2 or not isinstance(dims[3], int):
        return False
    if half == -1:  # an even Split: the halves come from D
        half = dims[3] // 2 if dims[3] % 2 == 0 else 0
    return half > 0 and dims[3] == 2 * half and None not in (dims[0], dims[2]) and [dims[0], dims[2]] == ids


def _ancestry(graph: onnx.GraphProto, nodes: Nodes, outputs: list[str]) -> tuple[list[onnx.NodeProto], set[str]]:
    """The nodes ``outputs`` are computed by (graph order) and the names they read that no node produces."""
    seen, leaves, stack = set(), set(), list(outputs)
    while stack:
        name = stack.pop()
        producer = nodes.producer(name)
        if producer is None:
            leaves.add(name)
        elif id(producer) not in seen:
            seen.add(id(producer))
            stack += [i for i in reads(producer) if i]
    return [n for n in graph.node if id(n) in seen], leaves


def _position_input(graph: onnx.GraphProto, nodes: Nodes, cos: str) -> str | None:
    """The one graph input ``cos`` is computed from (None when none, or several)."""
    _, leaves = _ancestry(graph, nodes, [cos])
    inputs = {v.name for v in graph.input} - {i.name for i in graph.initializer}
    found = leaves & inputs
    return next(iter(found)) if len(found) == 1 else None


def _tables(model: onnx.ModelProto, nodes: Nodes, shapes: dict[str, list], found: _Application, positions: int,
            run: Run, data_dir: Path | None, names: dict[bytes, tuple[str, str]]) -> tuple[str, str] | None:
    """The initializer names of ``found``'s ``[positions, D/2]`` cos/sin tables (added once per distinct pair),
    or None when cos and sin are not a rotate-half function of one position input (module docstring)."""
    graph = model.graph
    extracted = _extract(model, nodes, [found.cos, found.sin], data_dir)
    if extracted is None:
        return None
    sub, position = extracted
    if position != _position_input(graph, nodes, found.sin):
        return None
    dims = shapes[found.x]
    try:
        cos, sin = _evaluate(sub, run, found, position, np.arange(positions, dtype=np.int64)[None])
        probe = _PROBE % positions
        cos_probe, sin_probe = _evaluate(sub, run, found, position, probe)
    except Exception:  # any failure to evaluate (a position beyond a stored table, ...) leaves it as it is
        return None
    width = dims[3]
    if cos.dtype != np.float32 or cos.shape != (1, 1, positions, width) or sin.shape != cos.shape:
        return None
    if cos_probe.shape != (*probe.shape[:1], 1, probe.shape[1], width) or sin_probe.shape != cos_probe.shape:
        return None
    half = width // 2
    cos_rows, sin_rows = cos[0, 0], sin[0, 0]
    if not (_agree(cos_rows[:, :half], cos_rows[:, half:]) and _agree(sin_rows[:, :half], sin_rows[:, half:])
            and _agree(cos_probe[:, 0], cos_rows[probe]) and _agree(sin_probe[:, 0], sin_rows[probe])):
        return None
    cos_table = np.ascontiguousarray(cos_rows[:, :half])
    sin_table = np.ascontiguousarray(sin_rows[:, :half])
    key = cos_table.tobytes() + sin_table.tobytes()
    if key not in names:
        taken = {i.name for i in graph.initializer} | {o for n in graph.node for o in n.output}
        taken |= {v.name for v in graph.input}
        suffix = next(s for s in ("", *(f"_{i}" for i in range(1, len(names) + 2)))
                      if f"cos_cache{s}" not in taken and f"sin_cache{s}" not in taken)
        names[key] = (f"cos_cache{suffix}", f"sin_cache{suffix}")
        graph.initializer.extend([numpy_helper.from_array(cos_table, names[key][0]),
                                  numpy_helper.from_array(sin_table, names[key][1])])
    return names[key]


def _extract(model: onnx.ModelProto, nodes: Nodes, outputs: list[str],
             data_dir: Path | None) -> tuple[onnx.ModelProto, str] | None:
    """A model of the nodes between the graph's one integer input and ``outputs``, its constants inline, and that
    input's name; None when they read anything else, or an external constant without ``data_dir``."""
    graph = model.graph
    sub_nodes, leaves = _ancestry(graph, nodes, outputs)
    if any(s for n in sub_nodes for s in n.attribute if s.type in (onnx.AttributeProto.GRAPH,
                                                                     onnx.AttributeProto.GRAPHS)):
        return None
    inputs = {v.name: v for v in graph.input}
    initializers = []
    position = None
    for name in sorted(leaves):
        tensor = constant_tensor(graph, nodes, name)
        if tensor is not None:
            if uses_external_data(tensor):
                if data_dir is None:
                    return None
                tensor = numpy_helper.from_array(numpy_helper.to_array(tensor, base_dir=str(data_dir)), name)
            initializers.append(tensor)
        elif name in inputs and position is None and inputs[name].type.tensor_type.elem_type in (
                onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            position = name
        else:
            return None
    if position is None:
        return None
    value = oh.make_tensor_value_info
    sub = oh.make_graph(sub_nodes, "rotary_tables", [value(position, inputs[position].type.tensor_type.elem_type,
                                                           None)],
                        [onnx.ValueInfoProto(name=name) for name in outputs], initializers)
    opsets = [o for o in model.opset_import]
    return oh.make_model(sub, opset_imports=opsets, ir_version=model.ir_version), position


def _evaluate(sub: onnx.ModelProto, run: Run, found: _Application, position: str,
              ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    elem = sub.graph.input[0].type.tensor_type.elem_type
    out = run(sub, {position: ids.astype(np.int32 if elem == onnx.TensorProto.INT32 else np.int64)})
    return np.asarray(out[found.cos]), np.asarray(out[found.sin])


def _agree(got: np.ndarray, want: np.ndarray) -> bool:
    if got.shape != want.shape:
        return False
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    return bool(np.all(np.abs(got.astype(np.float64) - want) <= _AGREE * scale))


def _reference(model: onnx.ModelProto, feeds: Feeds) -> Feeds:
    from onnx.reference import ReferenceEvaluator

    names = [o.name for o in model.graph.output]
    return dict(zip(names, ReferenceEvaluator(model).run(None, feeds), strict=True))


def _read_shapes_from_positions(graph: onnx.GraphProto, rewritten: dict[str, str]) -> None:
    """A ``Shape`` of a rewritten cos/sin (the exporter reads the sequence length from ``sin``) reads the same
    dimension of the position input, so that nothing keeps the replaced cos/sin nodes alive for their shape:
    ``[batch, 1, seq, D]`` (checked at two probes in ``_tables``) has ``position_ids``' batch at 0, its seq at 2."""
    moved = {(0, 1): (0, 1), (2, 3): (1, 2)}
    for node in graph.node:
        if node.op_type != "Shape" or node.input[0] not in rewritten:
            continue
        start, end = attr(node, "start", 0), attr(node, "end", 4)
        span = (start + 4 if start < 0 else start, min(end + 4 if end < 0 else end, 4))
        if span in moved:
            node.input[0] = rewritten[node.input[0]]
            del node.attribute[:]
            start, end = moved[span]
            node.attribute.extend([oh.make_attribute("start", start), oh.make_attribute("end", end)])


def _int64(graph: onnx.GraphProto, position: str) -> str:
    """``position`` as int64 (the op's position_ids type): itself, or a Cast added once."""
    declared = next(v for v in graph.input if v.name == position).type.tensor_type.elem_type
    if declared == onnx.TensorProto.INT64:
        return position
    cast = f"genai/rotary/{position}/int64"
    graph.node.append(oh.make_node("Cast", [position], [cast], name=cast, to=onnx.TensorProto.INT64))
    return cast
