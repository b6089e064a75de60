"""The attnres op set's NumPy reference served to ONNX Runtime through onnxruntime-extensions.

Two limits of onnxruntime-extensions' Python ops shape this module (see docs/onnx-runtime-notes.md):
- an op has a fixed input list (no variadic inputs) and one registration per op type, so each arity gets its
  own op type ``AttnResAggregate__n<N>``;
- float16 and bfloat16 are not supported ("Type float16 not supported by python customops api", and the
  process aborts), so sources of those types are cast to float32 before the op and its result cast back.
  The op computes in float32 from the storage values and rounds its result to the storage type, so this is
  the op's own semantics, not an approximation.
Only the in-memory copy that ONNX Runtime runs is changed; the file is not.
"""

from __future__ import annotations

import functools

import onnx
from onnx import TensorProto
from onnx import helper as oh

from attnres.graphs.onnx_utils import replace_nodes, unique_namer
from attnres.graphs.types import value_types
from attnres.ops.identity import AGGREGATE, DOMAIN, ORT_TRT_DOMAIN
from attnres.ops.numpy_ref import attnres_aggregate_numpy


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
        if node.op_type != AGGREGATE:
            raise ValueError(f"no ONNX Runtime reference for attnres op {node.op_type!r}")
        node.domain = DOMAIN
        node.op_type = _register(len(node.input) - 1)
        for name in ("plugin_version", "plugin_namespace"):
            if not any(a.name == name for a in node.attribute):
                node.attribute.append(oh.make_attribute(name, ""))
        storage = types.get(node.input[1], TensorProto.FLOAT)
        if storage == TensorProto.FLOAT:
            nodes.append(node)
            continue
        widened = []
        for name in node.input[1:]:
            widened.append(fresh("f32"))
            nodes.append(oh.make_node("Cast", [name], [widened[-1]], to=TensorProto.FLOAT))
        result, narrow = fresh("f32_out"), node.output[0]
        del node.input[1:]
        node.input.extend(widened)
        node.output[0] = result
        nodes.append(node)
        nodes.append(oh.make_node("Cast", [result], [narrow], to=storage))
    replace_nodes(out.graph, nodes)
    kept = [e for e in out.opset_import if e.domain not in (DOMAIN, ORT_TRT_DOMAIN)]
    del out.opset_import[:]
    out.opset_import.extend([*kept, oh.make_opsetid(DOMAIN, 1)])
    return out
