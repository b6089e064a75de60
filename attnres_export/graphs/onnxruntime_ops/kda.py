"""Kimi Delta Attention as ONNX Runtime's own ``com.microsoft`` kernels (docs/onnxruntime-target.md#kda):
``LinearAttention`` for the gated delta rule and ``CausalConvWithState`` for the short convolutions around it.

``linear_attention``: each ``KimiDeltaAttention`` node (docs/op-set.md#kimideltaattention, either spelling)

    out, final_state = KimiDeltaAttention(q, k, v, g, beta, initial_state)    q, k, g [B,T,H,dk], v [B,T,H,dv]

becomes standard-op L2 norms of q and k in float32 (``x / sqrt(sum(x^2) + l2norm_eps)`` over dk, eps inside the
root, as the op defines them), Reshapes to the packed ``[B, T, H*d]`` form, and

    packed_out, final_state = LinearAttention(q', k', v', initial_state, g', beta)
                              update_rule="gated_delta", q_num_heads=kv_num_heads=H, scale=<the node's>

with a Reshape of the output back to ``[B, T, H, dv]``. The kernel takes T = float32/float16/bfloat16, but it
rounds what it is given to T and the op computes in float32 from the stored values (``g`` and the state are
float32): a half-precision node casts q, k, v, beta to float32 and the output back (``CastLike`` of v), so the
rewrite computes exactly what the op does. A zero ``initial_state`` (a zero ``ConstantOfShape`` or constant: the
plain, no-past graph) is not passed (the kernel's absent ``past_state`` is zeros). Left as they are: a node
missing an input (the op requires all six; an absent g has no defined meaning), a node with ``scale == 0`` (the
kernel reads 0 as "use 1/sqrt(dk)"), and a node whose H, dk, dv cannot be read statically (declared value types,
or the trailing constants of the Reshape/ConstantOfShape shape that produced a value).

``causal_convolutions``: each KDA short convolution (``KimiDeltaAttention._convolve``) as the exporters write it

    window = Concat[axis=-1](cache, x)                 cache [B,C,k-1], x [B,C,T] (the transposed projection)
    conv = Conv(window | Cast(window, float32), W [C,1,k], zero bias?)    depthwise, no pads, stride and dilation 1
    y = Mul(conv, Sigmoid(conv))                       SiLU, directly or after a Cast of conv (half precision)
    new_cache = Slice(window, ., end, axis -1, step 1) = the last k-1 columns (optional: absent in a plain graph)

becomes ``y, new_cache = CausalConvWithState(x, W, bias?, cache?)`` (channels first, ``activation="silu"``). A
half-precision model convolves in float32 (float32 weights): ``x`` and the cache are cast to float32, the op
computes with ``activation="none"`` under the Conv's output name and the model's own Cast and SiLU stay, and the
new cache is cast back (exact: it holds stored values). Channels first because the cache is channels first: the
channels-last layout would trade the two Transposes of the activations for two of the cache, which is the larger
tensor at decode (T = 1 < k-1), and ONNX Runtime's CPU kernel refuses ``state_channels_last``. A zero cache (plain
graph) is not passed. Anything else (another reader of the window or the Conv, other Conv attributes, a cache whose
width is not known to be k-1) stays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper as oh
from onnx import numpy_helper

from attnres_export.graphs.onnx_utils import unique_namer
from attnres_export.graphs.onnxruntime_ops.nodes import (
    MS_DOMAIN,
    Nodes,
    attr,
    constant_value,
    drop_dead_nodes,
    import_microsoft_domain,
)
from attnres_export.ops.descriptors import ATTNRES_DOMAINS, KIMI_DELTA_ATTENTION_OP
from attnres_export.ops.opset import KIMI_DELTA_ATTENTION

FLOAT = onnx.TensorProto.FLOAT
_SLICE_TO_END = 2**31 - 1
"""A Slice end at least this large reads to the end of the axis."""

Dims = tuple[int | None, ...]


# ---------------------------------------------------------------------------------------------------------------
# LinearAttention


def linear_attention(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place: each ``KimiDeltaAttention`` node whose shapes are known becomes L2 norms +
    ``com.microsoft.LinearAttention`` (module docstring). Returns how many nodes were rewritten."""
    graph = model.graph
    nodes, shapes = Nodes(graph), _Shapes(graph)
    fresh = unique_namer(graph, "ort_kda")
    done = 0
    for node in [n for n in graph.node if n.op_type == KIMI_DELTA_ATTENTION and n.domain in ATTNRES_DOMAINS]:
        replacement = _linear_attention_nodes(graph, nodes, shapes, node, fresh)
        if replacement is None:
            continue
        graph.node.remove(node)
        graph.node.extend(replacement)
        done += 1
    if done:
        _finish(model)
    return done


def _linear_attention_nodes(graph: onnx.GraphProto, nodes: Nodes, shapes: _Shapes, node: onnx.NodeProto,
                            fresh) -> list[onnx.NodeProto] | None:
    op = KIMI_DELTA_ATTENTION_OP
    q, k, v, g, beta, state = op.canonical_inputs(node)[:6]
    out, final_state = op.listed_outputs(node)[:2]
    scale, eps = attr(node, "scale", None), attr(node, "l2norm_eps", None)
    if not all((q, k, v, g, beta, state, out)) or scale is None or eps is None or scale == 0.0:
        return None
    q_dims, v_dims = shapes.dims(q, 4, nodes), shapes.dims(v, 4, nodes)
    heads, dk, dv = q_dims[2], q_dims[3], v_dims[3]
    if None in (heads, dk, dv):
        return None
    storage = shapes.elem_type(q)
    wide = storage == FLOAT
    name = node.name or fresh("kda")
    made: list[onnx.NodeProto] = []

    def const(hint: str, value: np.ndarray) -> str:
        out_name = fresh(hint)
        made.append(oh.make_node("Constant", [], [out_name], value=numpy_helper.from_array(value)))
        return out_name

    def emit(op_type: str, inputs: list[str], hint: str, **attrs) -> str:
        out_name = fresh(hint)
        made.append(oh.make_node(op_type, inputs, [out_name], name=f"{name}/{hint}", **attrs))
        return out_name

    def as_float(x: str, hint: str) -> str:
        return x if wide else emit("Cast", [x], f"{hint}_f32", to=FLOAT)

    last_axis = const("last_axis", np.array([-1], np.int64))
    eps_value = const("l2norm_eps", np.array(eps, np.float32))

    def l2_normalised(x: str, hint: str) -> str:
        x = as_float(x, hint)
        squares = emit("Mul", [x, x], f"{hint}_squared")
        total = emit("ReduceSum", [squares, last_axis], f"{hint}_sum_squares", keepdims=1)
        root = emit("Sqrt", [emit("Add", [total, eps_value], f"{hint}_plus_eps")], f"{hint}_norm")
        return emit("Div", [x, root], f"{hint}_l2")

    def packed(x: str, width: int, hint: str) -> str:
        return emit("Reshape", [x, const(f"{hint}_packed_shape", np.array([0, 0, width], np.int64))],
                    f"{hint}_packed")

    inputs = [packed(l2_normalised(q, "q"), heads * dk, "q"), packed(l2_normalised(k, "k"), heads * dk, "k"),
              packed(as_float(v, "v"), heads * dv, "v"),
              "" if _is_zero(graph, nodes, state) else state,
              packed(g, heads * dk, "g"), as_float(beta, "beta")]
    packed_out = fresh("out_packed")
    made.append(oh.make_node(
        "LinearAttention", inputs, [packed_out, final_state or fresh("final_state")], name=f"{name}/linear_attention",
        domain=MS_DOMAIN, update_rule="gated_delta", q_num_heads=heads, kv_num_heads=heads, scale=float(scale)))
    heads_shape = const("out_shape", np.array([0, 0, heads, dv], np.int64))
    if wide:
        made.append(oh.make_node("Reshape", [packed_out, heads_shape], [out], name=f"{name}/out"))
    else:
        made.append(oh.make_node("CastLike", [emit("Reshape", [packed_out, heads_shape], "out_f32"), v], [out],
                                 name=f"{name}/out"))
    return made


# ---------------------------------------------------------------------------------------------------------------
# CausalConvWithState


@dataclass
class _Conv:
    """One matched short convolution."""

    x: str
    cache: str | None
    """None: a zero cache, not passed."""
    weight: str
    bias: str | None
    output: str
    """The value the fused node produces (the SiLU's output, or the Conv's when it computes in float32 first)."""
    fused_silu: bool
    cast: bool
    """The window is cast to float32 before the Conv (a half-precision model)."""
    new_cache: str | None
    replaced: list[onnx.NodeProto]
    """Nodes whose outputs the fused node now produces."""


def causal_convolutions(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place: each KDA short convolution (Concat, depthwise Conv, SiLU, Slice of the cache)
    becomes one ``com.microsoft.CausalConvWithState`` (module docstring). Returns how many were rewritten."""
    graph = model.graph
    nodes, shapes = Nodes(graph), _Shapes(graph)
    matches = [m for m in (_match_conv(graph, nodes, shapes, n) for n in graph.node if n.op_type == "Conv") if m]
    fresh = unique_namer(graph, "ort_conv")
    for match in matches:
        for node in match.replaced:
            graph.node.remove(node)
        graph.node.extend(_conv_nodes(match, fresh))
    if matches:
        _finish(model)
    return len(matches)


def _match_conv(graph: onnx.GraphProto, nodes: Nodes, shapes: _Shapes, conv: onnx.NodeProto) -> _Conv | None:
    window = conv.input[0]
    cast = nodes.producer(window)
    if cast is not None and cast.op_type == "Cast":
        if attr(cast, "to", 0) != FLOAT or len(nodes.consumers.get(window, [])) != 1:
            return None
        window = cast.input[0]
    else:
        cast = None
    concat = nodes.producer(window)
    if concat is None or concat.op_type != "Concat" or len(concat.input) != 2 or attr(concat, "axis", None) not in (
            -1, 2):
        return None
    cache, x = concat.input
    weight = shapes.dims(conv.input[1], 3, nodes)
    channels, size = weight[0], weight[2]
    if channels is None or size is None or size < 2 or weight[1] != 1 or not _plain_depthwise(conv, channels, size):
        return None
    if shapes.dims(cache, 3, nodes)[2] != size - 1:
        return None
    bias = conv.input[2] if len(conv.input) > 2 and conv.input[2] else None
    if bias is not None and _is_zero(graph, nodes, bias):
        bias = None
    readers = nodes.consumers.get(window, [])
    slices = [r for r in readers if r is not (cast or conv)]
    if len(readers) - len(slices) != 1 or len(slices) > 1:
        return None
    new_cache = slices[0] if slices else None
    if new_cache is not None and not _takes_last(graph, nodes, shapes, new_cache, window, size - 1):
        return None
    silu = _silu(nodes, conv.output[0])
    if cast is None and silu is None:
        return None
    if cast is not None:  # computes in float32, rounds, then SiLU in the stored type: keep the model's own
        after = nodes.only_consumer(conv.output[0], "Cast")
        if after is None or _silu(nodes, after.output[0]) is None:
            return None
        output, fused, replaced = conv.output[0], False, [conv]
    else:
        output, fused, replaced = silu.output[0], True, [silu]
    return _Conv(x=x, cache=None if _is_zero(graph, nodes, cache) else cache, weight=conv.input[1], bias=bias,
                 output=output, fused_silu=fused, cast=cast is not None,
                 new_cache=new_cache.output[0] if new_cache is not None else None,
                 replaced=[*replaced, *([new_cache] if new_cache is not None else [])])


def _conv_nodes(match: _Conv, fresh) -> list[onnx.NodeProto]:
    made: list[onnx.NodeProto] = []
    name = fresh("causal_conv")

    def to_float(value: str) -> str:
        if not match.cast:
            return value
        out = fresh("f32")
        made.append(oh.make_node("Cast", [value], [out], name=out, to=FLOAT))
        return out

    x = to_float(match.x)
    cache = to_float(match.cache) if match.cache is not None else ""
    present = (fresh("present_f32") if match.cast else match.new_cache) if match.new_cache else fresh("present")
    made.append(oh.make_node("CausalConvWithState", [x, match.weight, match.bias or "", cache],
                             [match.output, present], name=name, domain=MS_DOMAIN,
                             activation="silu" if match.fused_silu else "none"))
    if match.cast and match.new_cache:
        made.append(oh.make_node("CastLike", [present, match.x], [match.new_cache], name=f"{name}/cache"))
    return made


def _plain_depthwise(conv: onnx.NodeProto, channels: int, size: int) -> bool:
    return (attr(conv, "group", 1) == channels and list(attr(conv, "kernel_shape", [size])) == [size]
            and list(attr(conv, "pads", [0, 0])) == [0, 0] and list(attr(conv, "strides", [1])) == [1]
            and list(attr(conv, "dilations", [1])) == [1]
            and attr(conv, "auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET"))


def _silu(nodes: Nodes, name: str) -> onnx.NodeProto | None:
    """The ``Mul(name, Sigmoid(name))`` reading ``name`` and nothing else."""
    readers = nodes.consumers.get(name, [])
    sigmoid = next((r for r in readers if r.op_type == "Sigmoid"), None)
    mul = nodes.only_consumer(sigmoid.output[0], "Mul") if sigmoid is not None else None
    if mul is None or len(readers) != 2 or not any(r is mul for r in readers):
        return None
    return mul if sorted(mul.input) == sorted([name, sigmoid.output[0]]) else None


def _takes_last(graph: onnx.GraphProto, nodes: Nodes, shapes: _Shapes, node: onnx.NodeProto, window: str,
                width: int) -> bool:
    """Is ``node`` a ``Slice`` of ``window`` giving its last ``width`` columns: axis -1, step 1, to the end, and
    starting at -width or (a computed start) with its output declared ``width`` wide."""
    if node.op_type != "Slice" or len(node.input) < 4 or node.input[0] != window:
        return False
    starts, ends, axes = (constant_value(graph, nodes, name) for name in node.input[1:4])
    steps = constant_value(graph, nodes, node.input[4]) if len(node.input) > 4 and node.input[4] else np.ones(1)
    if any(value is None or value.size != 1 for value in (ends, axes, steps)):
        return False
    if int(axes.reshape(-1)[0]) not in (-1, 2) or int(steps.reshape(-1)[0]) != 1:
        return False
    if int(ends.reshape(-1)[0]) < _SLICE_TO_END:
        return False
    if starts is not None:
        return starts.size == 1 and int(starts.reshape(-1)[0]) == -width
    return shapes.dims(node.output[0], 3, nodes)[2] == width


# ---------------------------------------------------------------------------------------------------------------
# shared


class _Shapes:
    """Static dims and element types of a graph's values, from what it declares (inputs, outputs, value_info,
    initializers), else from the trailing constants of the shape a Reshape or ConstantOfShape was given."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.declared: dict[str, tuple[int, Dims | None]] = {}
        for value in [*graph.input, *graph.value_info, *graph.output]:
            tensor = value.type.tensor_type
            if value.type.HasField("tensor_type"):
                dims = tuple(d.dim_value or None for d in tensor.shape.dim) if tensor.HasField("shape") else None
                self.declared.setdefault(value.name, (tensor.elem_type, dims))
        for init in graph.initializer:
            self.declared[init.name] = (init.data_type, tuple(init.dims))

    def elem_type(self, name: str) -> int:
        return self.declared.get(name, (0, None))[0]

    def dims(self, name: str, rank: int, nodes: Nodes) -> Dims:
        """``rank`` dims of ``name``, None where unknown."""
        declared = self.declared.get(name, (0, None))[1]
        known: list[int | None] = list(declared) if declared is not None and len(declared) == rank else [None] * rank
        producer = nodes.producer(name)
        if producer is not None and producer.op_type in ("Reshape", "ConstantOfShape"):
            shape_input = producer.input[1] if producer.op_type == "Reshape" else producer.input[0]
            trailing = self._trailing(shape_input, nodes)
            for i, dim in enumerate(reversed(trailing[-rank:] if trailing else [])):
                position = rank - 1 - i
                if known[position] is None and dim is not None and dim > 0:
                    known[position] = dim
        if producer is not None and producer.op_type == "Constant":
            value = constant_value(self.graph, nodes, name)
            if value is not None and value.ndim == rank:
                known = list(value.shape)
        return tuple(known)

    def _trailing(self, shape: str, nodes: Nodes) -> list[int | None]:
        """The known trailing entries of a 1-D int64 shape value: a constant, or a Concat whose last pieces are."""
        value = constant_value(self.graph, nodes, shape)
        if value is not None:
            return [int(d) for d in value.reshape(-1)]
        producer = nodes.producer(shape)
        if producer is None or producer.op_type != "Concat":
            return []
        entries: list[int | None] = []
        for piece in reversed(producer.input):
            value = constant_value(self.graph, nodes, piece)
            if value is None:
                break
            entries[:0] = [int(d) for d in value.reshape(-1)]
        return entries


def _is_zero(graph: onnx.GraphProto, nodes: Nodes, name: str) -> bool:
    """Is ``name`` all zeros: a constant, or a ConstantOfShape of a zero (or unset) value."""
    value = constant_value(graph, nodes, name)
    if value is not None:
        return not np.any(value)
    producer = nodes.producer(name)
    if producer is None or producer.op_type != "ConstantOfShape":
        return False
    fill = attr(producer, "value", None)
    return fill is None or not np.any(numpy_helper.to_array(fill))


def _finish(model: onnx.ModelProto) -> None:
    drop_dead_nodes(model.graph)
    produced = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    kept = [v for v in model.graph.value_info if v.name in produced]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    import_microsoft_domain(model)
