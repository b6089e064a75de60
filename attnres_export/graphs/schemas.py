"""ONNX schemas of the ``attnres`` domain, made from the op descriptors and registered with onnx so that
``onnx.checker`` validates our nodes; and that of ONNX Runtime's default-domain ``SimplifiedLayerNormalization``
(the ``onnxruntime`` target writes it; ``com.microsoft`` ops are in a domain the checker does not know)."""

from __future__ import annotations

import functools

import onnx
from onnx.defs import OpSchema

from attnres_export.dtypes import ONNX_TYPE_STRINGS
from attnres_export.graphs.onnxruntime_ops.norms import simplified_layer_norm_schema
from attnres_export.ops.descriptors import OPS, OpDescriptor, OutputSpec
from attnres_export.ops.opset import DOMAIN, OPSET_VERSION

_P = OpSchema.FormalParameter
_OPTIONS = {"single": OpSchema.FormalParameterOption.Single, "optional": OpSchema.FormalParameterOption.Optional,
            "variadic": OpSchema.FormalParameterOption.Variadic}


def _type(storage: bool) -> str:
    return "T" if storage else "tensor(float)"


def _output(spec: OutputSpec) -> OpSchema.FormalParameter:
    option = _OPTIONS["optional" if spec.presence_attribute else "single"]
    return _P(spec.name, _type(spec.storage), spec.doc, param_option=option)


def _attributes(op: OpDescriptor) -> list[OpSchema.Attribute]:
    attributes = [OpSchema.Attribute(a.name, OpSchema.AttrType.FLOAT, a.doc, required=True) for a in op.attributes]
    attributes += [OpSchema.Attribute(name, OpSchema.AttrType.INT, "compact spelling (tensorrt, ort-trt targets): 1 "
                                      "when the optional input or output is listed", required=False)
                   for name in op.presence_attributes]
    attributes += [OpSchema.Attribute("plugin_version", OpSchema.AttrType.STRING, "TensorRT plugin version",
                                      required=False),
                   OpSchema.Attribute("plugin_namespace", OpSchema.AttrType.STRING, "TensorRT plugin namespace",
                                      required=False)]
    return attributes


def public_schema(op: OpDescriptor) -> OpSchema:
    """The schema of ``op`` as docs/op-set.md states it."""
    inputs = [_P(i.name, _type(i.storage), i.doc, param_option=_OPTIONS[i.kind],
                 **({"min_arity": 1} if i.kind == "variadic" else {})) for i in op.inputs]
    return OpSchema(
        op.op_type, DOMAIN, OPSET_VERSION, doc=op.doc, inputs=inputs,
        outputs=[_output(o) for o in op.outputs],
        type_constraints=[("T", ONNX_TYPE_STRINGS, "storage type")], attributes=_attributes(op),
    )


def trace_schema(op: OpDescriptor) -> OpSchema:
    """The schema torch.onnx builds nodes with while tracing.

    torch.onnx (2.13) binds a variadic parameter to *all* positional arguments, so an op whose variadic input
    follows fixed ones is traced with one heterogeneous variadic; other ops trace with their public schema. Only
    the required outputs are traced: the torch ops return those.
    """
    if op.variadic is None:
        return public_schema(op)
    return OpSchema(
        op.op_type, DOMAIN, OPSET_VERSION, doc=f"Tracing-time view of {op.op_type}.",
        inputs=[_P("inputs", "V", "every input in order", param_option=_OPTIONS["variadic"], is_homogeneous=False,
                   min_arity=len(op.inputs))],
        outputs=[_output(o) for o in op.required_outputs],
        type_constraints=[("T", ONNX_TYPE_STRINGS, "storage type"), ("V", ONNX_TYPE_STRINGS, "any input")],
        attributes=_attributes(op),
    )


@functools.cache
def register_schemas() -> None:
    """Register the domain's schemas once per process (onnx keeps a global registry)."""
    for op in OPS.values():
        if not onnx.defs.has(op.op_type, DOMAIN):
            onnx.defs.register_schema(public_schema(op))
    if not onnx.defs.has("SimplifiedLayerNormalization"):
        onnx.defs.register_schema(simplified_layer_norm_schema())
