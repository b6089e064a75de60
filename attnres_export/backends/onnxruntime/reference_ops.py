"""The attnres op set's NumPy reference served to ONNX Runtime through onnxruntime-extensions.

Two limits of onnxruntime-extensions' Python ops shape this module (see docs/onnx-runtime-notes.md):
- an op has a fixed input list (no variadic or optional inputs) and one registration per op type, so each
  pattern of present inputs gets its own op type ``<OpType>__<pattern>`` (one digit per canonical position:
  1 listed, 0 absent), and absent inputs are dropped from the node;
- float16 and bfloat16 are not supported ("Type float16 not supported by python customops api", and the
  process aborts), so inputs and outputs of the storage type are cast through float32 around the op.
  The op computes in float32 from the storage values and rounds its result to the storage type, so this is
  the op's own semantics, not an approximation.
Everything here is read from the op descriptors. Only the in-memory copy that ONNX Runtime runs is changed.
"""

from __future__ import annotations

import functools

import onnx
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.graphs.onnx_utils import copy_model, replace_nodes, unique_namer
from attnres_export.graphs.types import value_types
from attnres_export.ops.descriptors import ATTNRES_DOMAINS, OPS, PLUGIN_ATTRIBUTES, OpDescriptor, is_attnres
from attnres_export.ops.opset import DOMAIN, OPSET_VERSION


def _extensions():
    import onnxruntime_extensions

    return onnxruntime_extensions


def library_path() -> str:
    """The onnxruntime-extensions library to pass to ``SessionOptions.register_custom_ops_library``."""
    return _extensions().get_library_path()


@functools.cache
def _register(op_type: str, pattern: tuple[bool, ...], n_outputs: int) -> str:
    """Register the reference of ``op_type`` for inputs listed as in ``pattern`` and its first ``n_outputs``
    outputs; returns the op type to use."""
    op = OPS[op_type]
    ext = _extensions()
    dt = ext.PyCustomOpDef
    name = f"{op.op_type}__{''.join('1' if p else '0' for p in pattern)}"
    if n_outputs < len(op.outputs):
        name += f"_{n_outputs}"

    def reference(*inputs, **attrs):
        listed = iter(inputs)
        canonical = [next(listed) if present else None for present in pattern]
        outputs = op.numpy_reference(canonical, attrs)[:n_outputs]
        return outputs[0] if len(outputs) == 1 else outputs

    attrs = {a.name: dt.dt_float for a in op.attributes}
    ext.onnx_op(
        op_type=f"{DOMAIN}::{name}",
        inputs=[dt.dt_float] * sum(pattern),
        outputs=[dt.dt_float] * n_outputs,
        attrs={**attrs, "plugin_version": dt.dt_string, "plugin_namespace": dt.dt_string},
    )(reference)
    return name


def with_reference_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose attnres nodes call the registered float32 reference ops (registering them on first use)."""
    out = copy_model(model)
    types = value_types(out)
    fresh = unique_namer(out.graph, "attnres_ref")
    nodes: list[onnx.NodeProto] = []
    for node in out.graph.node:
        if not is_attnres(node):
            nodes.append(node)
            continue
        op = OPS[node.op_type]
        inputs = op.canonical_inputs(node)
        storage = types.get(inputs[op.storage_input], TensorProto.FLOAT)
        op.expand(node)
        node.op_type = _register(op.op_type, tuple(bool(name) for name in inputs), len(node.output))
        kept = [a for a in node.attribute if a.name not in PLUGIN_ATTRIBUTES]
        del node.attribute[:]
        node.attribute.extend([*kept, *(oh.make_attribute(name, "") for name in PLUGIN_ATTRIBUTES)])
        node.domain = DOMAIN
        listed = [(name, op.spec_of(position).storage) for position, name in enumerate(inputs) if name]
        nodes.extend(_widen(node, op, listed, storage, fresh))
    replace_nodes(out.graph, nodes)
    kept = [e for e in out.opset_import if e.domain not in ATTNRES_DOMAINS]
    del out.opset_import[:]
    out.opset_import.extend([*kept, oh.make_opsetid(DOMAIN, OPSET_VERSION)])
    return out


def _widen(node: onnx.NodeProto, op: OpDescriptor, listed: list[tuple[str, bool]], storage: int,
           fresh) -> list[onnx.NodeProto]:
    """``node`` on the listed inputs, with storage-typed inputs and outputs cast through float32."""
    del node.input[:]
    if storage == TensorProto.FLOAT:
        node.input.extend(name for name, _ in listed)
        return [node]
    before, after = [], []
    for name, is_storage in listed:
        if is_storage:
            wide = fresh("f32")
            before.append(oh.make_node("Cast", [name], [wide], to=TensorProto.FLOAT))
            name = wide
        node.input.append(name)
    for index, spec in enumerate(op.outputs):
        if spec.storage and index < len(node.output) and node.output[index]:
            wide, narrow = fresh("f32_out"), node.output[index]
            node.output[index] = wide
            after.append(oh.make_node("Cast", [wide], [narrow], to=storage))
    return [*before, node, *after]
