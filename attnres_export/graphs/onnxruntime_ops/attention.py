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

becomes ``out, present.i.key, present.i.value = GroupQueryAttention(flat(Q), flat(K), flat(V), past key, past value,
seqlens_k, total_sequence_length)`` with ``do_rotary = 0`` (the keys are cached after rotary already). A layer that
does not match is left as it is; the caller checks the rewritten model's parity and says how many layers changed.
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
    graph.node.extend([
        *_flatten(core.query, f"{name}/query"), *_flatten(key_concat.input[1], f"{name}/key"),
        *_flatten(value_concat.input[1], f"{name}/value"),
        oh.make_node("GroupQueryAttention",
                     [f"{name}/query", f"{name}/key", f"{name}/value", key_concat.input[0], value_concat.input[0],
                      SEQLENS, TOTAL],
                     [core.flat.output[0], key_concat.output[0], value_concat.output[0]], name=f"{name}/gqa",
                     domain=MS_DOMAIN, num_heads=heads, kv_num_heads=kv_heads, scale=core.scale, do_rotary=0),
    ])
    for node in (key_concat, value_concat, core.flat):
        graph.node.remove(node)
    return True


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
        graph.node.extend([
            *_flatten(core.query, f"{name}/query"), *_flatten(core.key, f"{name}/key"),
            *_flatten(core.value, f"{name}/value"), *_empty_cache(core.key, f"{name}/past_key"),
            *_empty_cache(core.value, f"{name}/past_value"), *_full_lengths(f"{name}/query", name),
            oh.make_node("GroupQueryAttention",
                         [f"{name}/query", f"{name}/key", f"{name}/value", f"{name}/past_key", f"{name}/past_value",
                          f"{name}/seqlens_k", f"{name}/total"],
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


def _flatten(tensor: str, out: str) -> list[onnx.NodeProto]:
    """``[batch, heads, seq, head]`` -> ``[batch, seq, heads * head]``."""
    shape = f"{out}/shape"
    return [oh.make_node("Transpose", [tensor], [f"{out}/bshd"], perm=[0, 2, 1, 3]),
            oh.make_node("Constant", [], [shape], value=numpy_helper.from_array(np.array([0, 0, -1], np.int64))),
            oh.make_node("Reshape", [f"{out}/bshd", shape], [out])]


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
