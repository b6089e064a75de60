"""The attention of an onnxruntime-genai folder's model as ONNX Runtime's ``GroupQueryAttention`` contrib op
(docs/onnxruntime-target.md#attention).

The portable with-past graph concatenates each layer's past keys and values with the new ones and attends over the
result with standard ops: every decode step copies the whole cache (``Concat``), which is most of what separates
it from the folders onnxruntime-genai's model builder writes (benchmarks/genai_decode.py). ``GroupQueryAttention``
(``com.microsoft``) attends and appends in one kernel and lets onnxruntime-genai share one cache buffer between past
and present (``past_present_share_buffer``), so a step writes only the new tokens.

The rewrite is exact only under onnxruntime-genai's inputs: right padding, ``attention_mask`` 1 on every real token
(``GroupQueryAttention`` reads per-row lengths ``sum(mask) - 1`` and stores each row's keys contiguously; it reads
no mask otherwise). Each layer's pattern, as every with-past export writes it (docs/decode.md):

    present.i.key   = Concat(past_key_values.i.key, K)         K, V: [batch, kv_heads, seq, head]
    present.i.value = Concat(past_key_values.i.value, V)       Q: [batch, heads, seq, head] (through Reshapes)
    scores = MatMul(Q', Transpose(Unsqueeze*(present.i.key))) * scale     (* also Casts of a float16 model)
    probs = Softmax(Where(not allowed, lowest, scores))
    out = Reshape(Transpose(Reshape*(MatMul(probs, Unsqueeze*(present.i.value))), [0, 2, 1, 3]))
                                                               out: [batch, seq, heads * head]

becomes ``out, present.i.key, present.i.value = GroupQueryAttention(Q, K, V, past key, past value, seqlens_k,
total_sequence_length)`` on the packed ``[batch, seq, heads * head]`` projections (``_Flat``), as
onnxruntime-genai's model builder feeds it: the projection's own output where the export only split it to heads and
transposed it, rotary (``rotary.py``'s RotaryEmbedding, run before this rewrite) applied to that packed form, so
no Transpose or Reshape is left around the op. Where the kernel can rotate the queries and keys itself
(``_inner_rotary``: float32, a head size that is a multiple of 16) the two RotaryEmbedding nodes go too and the op
reads ``cos_cache``, ``sin_cache`` and ``position_ids`` with ``do_rotary = 1``; otherwise ``do_rotary = 0`` (the
keys are cached after rotary already). A per-head norm (Qwen3's ``q_norm``/``k_norm``) keeps its split to heads,
with a constant shape (``_constant_head_splits``). Per Llama layer the attention is 3 MatMul, 2 RotaryEmbedding and
GroupQueryAttention (2 fewer with ``do_rotary``), where the standard-op split and transposes left 8 Reshape,
6 Transpose and their shape nodes beside them. A layer that does not match is left as it is; the caller checks the
rewritten model's parity and says how many layers changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper as oh
from onnx import numpy_helper

from attnres_export.graphs.onnxruntime_ops.nodes import (
    MS_DOMAIN,
    Nodes,
    attr,
    constant_value,
    declared_shapes,
    drop_dead_nodes,
    import_microsoft_domain,
    scalar_operand,
)
from attnres_export.models.base import PAST_PREFIX, PRESENT_PREFIX

SEQLENS, TOTAL = "genai/seqlens_k", "genai/total_sequence_length"


@dataclass
class Rewrite:
    model: onnx.ModelProto
    layers: int
    """Attention layers now computed by GroupQueryAttention."""
    of: int
    """Attention layers in the model."""


def group_query_attention(model: onnx.ModelProto, heads: int, kv_heads: int) -> Rewrite:
    """Rewrite ``model`` in place: its matching attention layers become GroupQueryAttention nodes (module
    docstring). In place, because a copy would hold the weights of a model stored inline twice."""
    out = model
    graph = out.graph
    layers = sorted({name.split(".")[1] for name in (v.name for v in graph.input) if name.startswith(PAST_PREFIX)},
                    key=int)
    done = 0
    for layer in layers:
        done += _rewrite_layer(graph, layer, heads, kv_heads)
    if done:
        _add_lengths(graph)
        _constant_head_splits(graph)
        drop_dead_nodes(graph)
        import_microsoft_domain(out)
    return Rewrite(out, done, len(layers))


def _rewrite_layer(graph: onnx.GraphProto, layer: str, heads: int, kv_heads: int) -> bool:
    nodes = Nodes(graph)
    key_concat = nodes.producer(f"{PRESENT_PREFIX}{layer}.key")
    value_concat = nodes.producer(f"{PRESENT_PREFIX}{layer}.value")
    if not (_is_cache_concat(key_concat, f"{PAST_PREFIX}{layer}.key")
            and _is_cache_concat(value_concat, f"{PAST_PREFIX}{layer}.value")):
        return False
    transpose = nodes.follow(key_concat.output[0], "Transpose")
    core = _attention_core(graph, nodes, transpose) if transpose is not None else None
    if core is None or core.value != value_concat.output[0]:
        return False
    name = f"genai/layer{layer}"
    flat = _Flat(graph, nodes)
    query, key, value = (flat(core.query, f"{name}/query"), flat(key_concat.input[1], f"{name}/key"),
                         flat(value_concat.input[1], f"{name}/value"))
    rotary = _inner_rotary(flat, query, key, flat.shapes.get(key_concat.input[0], [None])[-1])
    query, key, tables = rotary or (query, key, [])
    graph.node.extend([
        *flat.nodes,
        oh.make_node("GroupQueryAttention",
                     [query, key, value, key_concat.input[0], value_concat.input[0], SEQLENS, TOTAL, *tables],
                     [core.flat.output[0], key_concat.output[0], value_concat.output[0]], name=f"{name}/gqa",
                     domain=MS_DOMAIN, num_heads=heads, kv_num_heads=kv_heads, scale=core.scale,
                     do_rotary=int(rotary is not None)),
    ])
    for node in (key_concat, value_concat, core.flat):
        graph.node.remove(node)
    return True


def _inner_rotary(flat: _Flat, query: str, key: str, head: int | None) -> tuple[str, str, list[str]] | None:
    """``(query, key, [cos_cache, sin_cache, position_ids])`` with the queries and keys before their
    RotaryEmbedding, when GroupQueryAttention can rotate them itself (``do_rotary = 1``: two nodes per layer
    fewer): each is one RotaryEmbedding of the same positions and tables with the op's defaults (rotate-half over
    the whole head, as ``rotary.py`` writes it), on a head size its CPU kernel rotates (a multiple of 16). A
    half-precision model's rotary runs in float32 between Casts and stays outside: the op would rotate in the
    model's type. The op's positions (ONNX Runtime 1.32): ``position_ids[b, s]`` on a step with a cache, but
    ``position_ids[0, 0] + s`` for every row of a prompt over an empty cache, the same for the right-padded rows
    GroupQueryAttention needs when they start at one position (every feed of the parity check and of
    onnxruntime-genai); a prompt's row starting elsewhere caches its keys rotated from the first row's start."""
    rotations = [flat.producer(query), flat.producer(key)]
    if not (isinstance(head, int) and head % 16 == 0 and all(
            r is not None and r.op_type == "RotaryEmbedding" and r.domain == MS_DOMAIN
            and [(a.name, a.i) for a in r.attribute] == [("interleaved", 0)] for r in rotations)):
        return None
    query_rotation, key_rotation = rotations
    position, cos, sin = query_rotation.input[1:4]
    if list(key_rotation.input[1:4]) != [position, cos, sin]:
        return None
    for rotation in rotations:
        flat.nodes.remove(rotation)
    return query_rotation.input[0], key_rotation.input[0], [cos, sin, position]


@dataclass
class _Core:
    """One attention: ``Reshape(Transpose(softmax(masked(Q K^T * scale)) V))``, read back from the key's
    Transpose."""

    query: str
    """Q ``[batch, heads, seq, head]`` before the grouped heads' Reshapes."""
    key: str
    value: str
    """K and V ``[batch, kv_heads, seq, head]`` as the attention reads them (before Unsqueezes, Reshapes)."""
    scale: float
    flat: onnx.NodeProto
    """The Reshape writing the attention's output ``[batch, seq, heads * head]``."""


def _attention_core(graph: onnx.GraphProto, nodes: Nodes, transpose: onnx.NodeProto) -> _Core | None:
    scores = nodes.only_consumer(transpose.output[0], "MatMul")
    if scores is None or scores.input[1] != transpose.output[0] or not _swaps_last_two(transpose):
        return None
    scale_node = nodes.only_consumer(scores.output[0], "Mul")
    scale = scalar_operand(graph, nodes, scale_node, scores.output[0]) if scale_node is not None else None
    where = nodes.only_consumer(scale_node.output[0], "Where") if scale is not None else None
    if where is None or where.input[2] != scale_node.output[0]:
        return None
    softmax = nodes.only_consumer(where.output[0], "Softmax")
    mixed = nodes.only_consumer(softmax.output[0], "MatMul") if softmax is not None else None
    if mixed is None or mixed.input[0] != softmax.output[0] or attr(softmax, "axis", -1) not in (-1, 3, 4):
        return None
    heads_out = mixed.output[0]
    while (step := nodes.only_consumer(heads_out, "Reshape") or nodes.only_consumer(heads_out, "Cast")) is not None:
        heads_out = step.output[0]
    back = nodes.only_consumer(heads_out, "Transpose")
    flat = nodes.only_consumer(back.output[0], "Reshape") if back is not None else None
    if flat is None or list(attr(back, "perm", [])) != [0, 2, 1, 3]:
        return None
    return _Core(nodes.source(scores.input[0]), nodes.source(transpose.input[0]), nodes.source(mixed.input[1]),
                 scale, flat)


def causal_group_query_attention(model: onnx.ModelProto, heads: int, kv_heads: int) -> int:
    """Rewrite a graph without past in place: each attention becomes a GroupQueryAttention over an empty cache
    (``Slice`` of the new keys to no positions), every row ``seq`` tokens long, causal. Exact for the graphs without
    past the exporter writes, whose only input is ``input_ids`` (no padding: the mask is causal alone); a graph with
    an ``attention_mask`` input is left as it is. Returns the count."""
    graph = model.graph
    if any(v.name == "attention_mask" for v in graph.input):
        return 0
    done = 0
    for transpose in [n for n in graph.node if n.op_type == "Transpose"]:
        nodes = Nodes(graph)
        core = _attention_core(graph, nodes, transpose)
        if core is None or nodes.producer(core.key) is None or core.key.startswith(PAST_PREFIX):
            continue
        name = f"ort/attention{done}"
        flat = _Flat(graph, nodes)
        query, key, value = (flat(core.query, f"{name}/query"), flat(core.key, f"{name}/key"),
                             flat(core.value, f"{name}/value"))
        graph.node.extend([
            *flat.nodes, *_empty_cache(core.key, f"{name}/past_key"), *_empty_cache(core.value, f"{name}/past_value"),
            *_full_lengths(query, name),
            oh.make_node("GroupQueryAttention",
                         [query, key, value, f"{name}/past_key", f"{name}/past_value", f"{name}/seqlens_k",
                          f"{name}/total"],
                         [core.flat.output[0], f"{name}/present_key", f"{name}/present_value"], name=f"{name}/gqa",
                         domain=MS_DOMAIN, num_heads=heads, kv_num_heads=kv_heads, scale=core.scale, do_rotary=0),
        ])
        graph.node.remove(core.flat)
        done += 1
    if done:
        drop_dead_nodes(graph)
        import_microsoft_domain(model)
    return done


def _empty_cache(tensor: str, out: str) -> list[onnx.NodeProto]:
    """``tensor[:, :, :0]``: a cache of no positions with ``tensor``'s batch, heads, head size and type."""
    c = {k: f"{out}/{k}" for k in ("zero", "axis")}
    return [oh.make_node("Constant", [], [c["zero"]], value=numpy_helper.from_array(np.array([0], np.int64))),
            oh.make_node("Constant", [], [c["axis"]], value=numpy_helper.from_array(np.array([2], np.int64))),
            oh.make_node("Slice", [tensor, c["zero"], c["zero"], c["axis"]], [out])]


def _full_lengths(query: str, name: str) -> list[onnx.NodeProto]:
    """``seqlens_k = seq - 1`` for every row and ``total_sequence_length = seq`` (int32) of ``query [batch, seq,
    hidden]``."""
    c = {k: f"{name}/{k}" for k in ("batch", "seq", "one", "last", "last32", "seq_scalar")}
    return [oh.make_node("Shape", [query], [c["batch"]], start=0, end=1),
            oh.make_node("Shape", [query], [c["seq"]], start=1, end=2),
            oh.make_node("Constant", [], [c["one"]], value=numpy_helper.from_array(np.array([1], np.int64))),
            oh.make_node("Sub", [c["seq"], c["one"]], [c["last"]]),
            oh.make_node("Cast", [c["last"]], [c["last32"]], to=onnx.TensorProto.INT32),
            oh.make_node("Expand", [c["last32"], c["batch"]], [f"{name}/seqlens_k"]),
            oh.make_node("Squeeze", [c["seq"]], [c["seq_scalar"]]),
            oh.make_node("Cast", [c["seq_scalar"]], [f"{name}/total"], to=onnx.TensorProto.INT32)]


class _Flat:
    """GroupQueryAttention's ``[batch, seq, heads * head]`` form of the ``[batch, heads, seq, head]`` values the
    standard-op attention reads, with the nodes that compute it (``nodes``, to add to the graph).

    The export writes each projection as ``Transpose(Reshape(MatMul(x, W), [batch, seq, heads, head]), [0, 2, 1,
    3])``, then rotary (``RotaryEmbedding``, and a half-precision model's ``Cast``s around it) on the heads-first
    form. Those compute each position's values from that position alone, and ``RotaryEmbedding`` takes the packed
    3-D form too (head size from its tables, ``position_ids`` as before), so they are written again on the packed
    form and the attention reads the projection's own output: no Transpose to heads-first and back, no Reshape to
    heads and back, one decode step's dispatch of four to six nodes per projection less. Any other producer is
    flattened by a Transpose and a Reshape. The replaced nodes are left for ``drop_dead_nodes``."""

    _PER_POSITION = ("Cast", "RotaryEmbedding")
    """Ops on the heads-first values written again on the packed form: their first input read position by
    position."""

    def __init__(self, graph: onnx.GraphProto, nodes: Nodes) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.shapes = declared_shapes(graph)
        self._by_name = nodes

    def __call__(self, tensor: str, out: str) -> str:
        """The name of ``tensor``'s packed form (``out`` or a name below it, or a value the graph already has)."""
        chain, name = [], tensor
        while (node := self._by_name.producer(name)) is not None and node.op_type in self._PER_POSITION:
            chain.append(node)
            name = node.input[0]
        transpose = self._by_name.producer(name)
        if transpose is None or transpose.op_type != "Transpose" or list(attr(transpose, "perm", [])) != [0, 2, 1, 3]:
            return self._reshaped(self._transposed(tensor, out), out)
        flat = self._merged_heads(transpose.input[0], out)
        for step, node in enumerate(reversed(chain)):
            flat = self._again(node, flat, f"{out}/{step}")
        return flat

    def producer(self, name: str) -> onnx.NodeProto | None:
        """The node of ``nodes`` writing ``name``."""
        return next((n for n in self.nodes if name in n.output), None)

    def _merged_heads(self, heads: str, out: str) -> str:
        """``heads [batch, seq, heads, head]`` as ``[batch, seq, heads * head]``: the projection it was reshaped
        from when that is declared so, else a Reshape."""
        producer = self._by_name.producer(heads)
        if producer is not None and producer.op_type == "Reshape" and _splits_heads(self.shapes, producer):
            return producer.input[0]
        return self._reshaped(heads, f"{out}/bs")

    def _again(self, node: onnx.NodeProto, flat: str, out: str) -> str:
        """``node`` (one input read per position, one output) computed again on ``flat``."""
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[0] = flat
        copy.output[0] = out
        copy.name = out
        self.nodes.append(copy)
        return out

    def _transposed(self, tensor: str, out: str) -> str:
        self.nodes.append(oh.make_node("Transpose", [tensor], [f"{out}/bshd"], perm=[0, 2, 1, 3]))
        return f"{out}/bshd"

    def _reshaped(self, tensor: str, out: str) -> str:
        """``tensor [batch, seq, heads, head]`` -> ``out [batch, seq, heads * head]``."""
        shape = f"{out}/shape"
        self.nodes += [
            oh.make_node("Constant", [], [shape], value=numpy_helper.from_array(np.array([0, 0, -1], np.int64))),
            oh.make_node("Reshape", [tensor, shape], [out])]
        return out


def _splits_heads(shapes: dict[str, list], reshape: onnx.NodeProto) -> bool:
    """``reshape`` is declared ``[batch, seq, heads * head]`` -> ``[batch, seq, heads, head]``."""
    packed, split = shapes.get(reshape.input[0]), shapes.get(reshape.output[0])
    return (packed is not None and split is not None and len(packed) == 3 and len(split) == 4
            and None not in packed[:2] and packed[:2] == split[:2]
            and all(isinstance(d, int) for d in (packed[2], *split[2:])) and packed[2] == split[2] * split[3])


def _constant_head_splits(graph: onnx.GraphProto) -> None:
    """Each split of a projection to heads that stays (Qwen3's per-head ``q_norm``/``k_norm`` read it) reshapes
    to the constant ``[0, 0, heads, head]``: the export computes that shape at run time from ``Shape`` nodes, four
    to five nodes per split that a decode step would dispatch for the same two numbers."""
    shapes = declared_shapes(graph)
    nodes = Nodes(graph)
    for reshape in [n for n in graph.node if n.op_type == "Reshape"]:
        if _splits_heads(shapes, reshape) and constant_value(graph, nodes, reshape.input[1]) is None:
            shape = f"{reshape.output[0]}/heads"
            graph.node.append(oh.make_node("Constant", [], [shape], value=numpy_helper.from_array(
                np.array([0, 0, *shapes[reshape.output[0]][2:]], np.int64))))
            reshape.input[1] = shape
            del reshape.attribute[:]  # allowzero 0: the zeros copy batch and seq


def _add_lengths(graph: onnx.GraphProto) -> None:
    """``seqlens_k = sum(attention_mask) - 1`` and ``total_sequence_length = attention_mask.shape[1]``, int32."""
    c = {name: f"genai/{name}" for name in ("axis", "one", "sum", "minus", "shape", "total64")}
    graph.node.extend([
        oh.make_node("Constant", [], [c["axis"]], value=numpy_helper.from_array(np.array([1], np.int64))),
        oh.make_node("Constant", [], [c["one"]], value=numpy_helper.from_array(np.array(1, np.int64))),
        oh.make_node("ReduceSum", ["attention_mask", c["axis"]], [c["sum"]], keepdims=0),
        oh.make_node("Sub", [c["sum"], c["one"]], [c["minus"]]),
        oh.make_node("Cast", [c["minus"]], [SEQLENS], to=onnx.TensorProto.INT32),
        oh.make_node("Shape", ["attention_mask"], [c["shape"]], start=1, end=2),
        oh.make_node("Squeeze", [c["shape"]], [c["total64"]]),
        oh.make_node("Cast", [c["total64"]], [TOTAL], to=onnx.TensorProto.INT32),
    ])


def _is_cache_concat(node: onnx.NodeProto | None, past: str) -> bool:
    return (node is not None and node.op_type == "Concat" and len(node.input) == 2 and node.input[0] == past
            and attr(node, "axis", None) in (2, -2))


def _swaps_last_two(node: onnx.NodeProto) -> bool:
    perm = list(attr(node, "perm", []))
    return len(perm) >= 2 and perm[-2:] == [len(perm) - 1, len(perm) - 2] and perm[:-2] == list(range(len(perm) - 2))
