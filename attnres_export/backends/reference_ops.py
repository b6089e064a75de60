"""The attnres op set's NumPy reference served to ONNX Runtime through onnxruntime-extensions.

Two limits of onnxruntime-extensions' Python ops shape this module (see docs/onnx-runtime-notes.md):
- an op has a fixed input list (no variadic inputs) and one registration per op type, so each arity gets its
  own op type ``AttnResAggregate__n<N>``;
- float16 and bfloat16 are not supported ("Type float16 not supported by python customops api", and the
  process aborts), so sources of those types are cast to float32 before the op and its result cast back.
  The op computes in float32 from the storage values and rounds its result to the storage type, so this is
  the op's own semantics, not an approximation.
Optional inputs are absent or present per node, and a Python op's input list is fixed, so
ResidualScoreAttention gets one op type per presence pattern, ``ResidualScoreAttention__prev<0|1>_mask<0|1>``,
and absent inputs are dropped from the node. Its two outputs come back as a tuple; ``scores`` is float32 in
every storage type, so only ``out`` is cast back.
Only the in-memory copy that ONNX Runtime runs is changed; the file is not.
"""

from __future__ import annotations

import functools

import onnx
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.graphs.onnx_utils import replace_nodes, unique_namer
from attnres_export.graphs.optional_inputs import attention_inputs, drop_presence
from attnres_export.graphs.types import value_types
from attnres_export.ops.identity import AGGREGATE, DOMAIN, ORT_TRT_DOMAIN, RESIDUAL_ATTENTION
from attnres_export.ops.numpy_ref import attnres_aggregate_numpy, residual_score_attention_numpy


def _extensions():
    import onnxruntime_extensions

    return onnxruntime_extensions


def library_path() -> str:
    """The onnxruntime-extensions library to pass to ``SessionOptions.register_custom_ops_library``."""
    return _extensions().get_library_path()


@functools.cache
def _register(arity: int) -> str:
    ext = _extensions()
    dt = ext.PyCustomOpDef
    op_type = f"{AGGREGATE}__n{arity}"

    def aggregate(score_weight, *sources, eps, **_plugin_attrs):
        return attnres_aggregate_numpy(score_weight, sources, eps)

    ext.onnx_op(
        op_type=f"{DOMAIN}::{op_type}",
        inputs=[dt.dt_float] * (arity + 1),
        outputs=[dt.dt_float],
        attrs={"eps": dt.dt_float, "plugin_version": dt.dt_string, "plugin_namespace": dt.dt_string},
    )(aggregate)
    return op_type


@functools.cache
def _register_attention(has_prev: bool, has_mask: bool) -> str:
    ext = _extensions()
    dt = ext.PyCustomOpDef
    op_type = f"{RESIDUAL_ATTENTION}__prev{int(has_prev)}_mask{int(has_mask)}"

    def attention(q, k, v, *optional, scale, logit_divisor, **_plugin_attrs):
        rest = iter(optional)
        prev = next(rest) if has_prev else None
        mask = next(rest) if has_mask else None
        return residual_score_attention_numpy(q, k, v, prev, mask, scale, logit_divisor)

    ext.onnx_op(
        op_type=f"{DOMAIN}::{op_type}",
        inputs=[dt.dt_float] * (3 + has_prev + has_mask),
        outputs=[dt.dt_float, dt.dt_float],
        attrs={"scale": dt.dt_float, "logit_divisor": dt.dt_float, "plugin_version": dt.dt_string,
               "plugin_namespace": dt.dt_string},
    )(attention)
    return op_type


def with_reference_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose attnres nodes call the registered float32 reference ops (registering them on first use)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    types = value_types(out)
    fresh = unique_namer(out.graph, "attnres_ref")
    nodes: list[onnx.NodeProto] = []
    for node in out.graph.node:
        if node.domain not in (DOMAIN, ORT_TRT_DOMAIN):
            nodes.append(node)
            continue
        if node.op_type == AGGREGATE:
            node.op_type, first_stored = _register(len(node.input) - 1), 1
        elif node.op_type == RESIDUAL_ATTENTION:
            inputs = attention_inputs(node)
            node.op_type, first_stored = _register_attention(bool(inputs[3]), bool(inputs[4])), 0
            drop_presence(node)
            del node.input[:]
            node.input.extend(name for name in inputs if name)
        else:
            raise ValueError(f"no ONNX Runtime reference for attnres op {node.op_type!r}")
        node.domain = DOMAIN
        for name in ("plugin_version", "plugin_namespace"):
            if not any(a.name == name for a in node.attribute):
                node.attribute.append(oh.make_attribute(name, ""))
        nodes.extend(_widen(node, types, first_stored, fresh))
    replace_nodes(out.graph, nodes)
    kept = [e for e in out.opset_import if e.domain not in (DOMAIN, ORT_TRT_DOMAIN)]
    del out.opset_import[:]
    out.opset_import.extend([*kept, oh.make_opsetid(DOMAIN, 1)])
    return out


def _widen(node: onnx.NodeProto, types: dict[str, int], first_stored: int, fresh) -> list[onnx.NodeProto]:
    """``node`` with its storage-typed inputs (from ``first_stored``) and first output cast through float32.

    The storage type is the type of input ``first_stored``; inputs of that type are widened, float32 ones
    (``prev_scores``, ``mask_bias``) pass as they are.
    """
    storage = types.get(node.input[first_stored], TensorProto.FLOAT)
    if storage == TensorProto.FLOAT:
        return [node]
    nodes, inputs = [], list(node.input)
    for i, name in enumerate(inputs):
        if i >= first_stored and types.get(name) == storage:
            inputs[i] = fresh("f32")
            nodes.append(oh.make_node("Cast", [name], [inputs[i]], to=TensorProto.FLOAT))
    result, narrow = fresh("f32_out"), node.output[0]
    del node.input[:]
    node.input.extend(inputs)
    node.output[0] = result
    return [*nodes, node, oh.make_node("Cast", [result], [narrow], to=storage)]
