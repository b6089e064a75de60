"""ONNX schemas of the ``attnres`` domain, registered with onnx so ``onnx.checker`` validates our nodes."""

from __future__ import annotations

import functools

import onnx
from onnx.defs import OpSchema

from attnres_export.ops.identity import AGGREGATE, DOMAIN, MAX_SOURCES, OPSET_VERSION, RESIDUAL_ATTENTION

STORAGE_TYPES = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]

_P = OpSchema.FormalParameter
_VARIADIC = OpSchema.FormalParameterOption.Variadic
_OPTIONAL = OpSchema.FormalParameterOption.Optional


def _plugin_attributes() -> list[OpSchema.Attribute]:
    return [
        OpSchema.Attribute("plugin_version", OpSchema.AttrType.STRING, "TensorRT plugin version", required=False),
        OpSchema.Attribute("plugin_namespace", OpSchema.AttrType.STRING, "TensorRT plugin namespace", required=False),
    ]


def aggregate_schema() -> OpSchema:
    """The public schema of AttnResAggregate (SPEC 4)."""
    return OpSchema(
        AGGREGATE,
        DOMAIN,
        OPSET_VERSION,
        doc="Softmax-weighted sum of the sources over depth (attention residuals, SPEC 1.2).",
        inputs=[
            _P("score_weight", "tensor(float)", "folded gain * pseudo-query, [D], float32"),
            _P("sources", "T", f"1..{MAX_SOURCES} tensors [..., D]", param_option=_VARIADIC, min_arity=1),
        ],
        outputs=[_P("h", "T", "aggregated representation [..., D]")],
        type_constraints=[("T", STORAGE_TYPES, "storage type of sources and output")],
        attributes=[
            OpSchema.Attribute("eps", OpSchema.AttrType.FLOAT, "added to the mean square", required=True),
            *_plugin_attributes(),
        ],
    )


def aggregate_trace_schema() -> OpSchema:
    """AttnResAggregate with all inputs as one heterogeneous variadic, for torch.onnx's node builder.

    torch.onnx (2.13) binds a variadic parameter to *all* positional arguments, so a schema with a
    fixed first input duplicates it; this schema only shapes the call while tracing.
    """
    return OpSchema(
        AGGREGATE,
        DOMAIN,
        OPSET_VERSION,
        doc="Tracing-time view of AttnResAggregate.",
        inputs=[_P("inputs", "V", "score_weight then sources", param_option=_VARIADIC, is_homogeneous=False,
                   min_arity=2)],
        outputs=[_P("h", "T", "aggregated representation")],
        type_constraints=[("T", STORAGE_TYPES, "storage type"), ("V", STORAGE_TYPES, "any input")],
        attributes=[
            OpSchema.Attribute("eps", OpSchema.AttrType.FLOAT, "added to the mean square", required=True),
            *_plugin_attributes(),
        ],
    )


def residual_attention_schema() -> OpSchema:
    """The public schema of ResidualScoreAttention (SPEC 4); torch.onnx also traces with it.

    Optional inputs bind one argument each (unlike variadics); an absent one is an empty input name.
    """
    return OpSchema(
        RESIDUAL_ATTENTION,
        DOMAIN,
        OPSET_VERSION,
        doc="Attention whose raw scores add the previous layer's (RealFormer, SPEC 3).",
        inputs=[
            _P("q", "T", "queries [B, H, Tq, dh]"),
            _P("k", "T", "keys [B, H, Tk, dh]"),
            _P("v", "T", "values [B, H, Tk, dv]"),
            _P("prev_scores", "tensor(float)", "previous running score sum [B, H, Tq, Tk]; absent at the first layer",
               param_option=_OPTIONAL),
            _P("mask_bias", "tensor(float)", "additive bias broadcastable to [B, H, Tq, Tk]; not carried",
               param_option=_OPTIONAL),
        ],
        outputs=[
            _P("out", "T", "attention output [B, H, Tq, dv]"),
            _P("scores", "tensor(float)", "scale*QK^T + prev_scores [B, H, Tq, Tk], pre-mask and pre-divisor"),
        ],
        type_constraints=[("T", STORAGE_TYPES, "storage type of q, k, v and out")],
        attributes=[
            OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, "multiplies QK^T (1/sqrt(dh))", required=True),
            OpSchema.Attribute("logit_divisor", OpSchema.AttrType.FLOAT, "divides the scores before the mask",
                               required=True),
            OpSchema.Attribute("has_prev_scores", OpSchema.AttrType.INT,
                               "compact spelling (tensorrt target): 1 when prev_scores is among the inputs",
                               required=False),
            OpSchema.Attribute("has_mask", OpSchema.AttrType.INT,
                               "compact spelling (tensorrt target): 1 when mask_bias is among the inputs",
                               required=False),
            *_plugin_attributes(),
        ],
    )


@functools.cache
def register_schemas() -> None:
    """Register the domain's schemas once per process (onnx keeps a global registry)."""
    if not onnx.defs.has(AGGREGATE, DOMAIN):
        onnx.defs.register_schema(aggregate_schema())
    if not onnx.defs.has(RESIDUAL_ATTENTION, DOMAIN):
        onnx.defs.register_schema(residual_attention_schema())
