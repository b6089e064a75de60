"""torch.nn.Module -> ONNX through ``torch.onnx.export(dynamo=True)``, one attnres node per custom-op call."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

import onnx
import onnxscript
import torch
from torch import nn

from attnres_export.errors import ExportError
from attnres_export.exporter.ranges import DimRange
from attnres_export.graphs.schemas import aggregate_trace_schema, register_schemas, residual_attention_schema
from attnres_export.ops.identity import (
    AGGREGATE,
    DOMAIN,
    OPSET_VERSION,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    RESIDUAL_ATTENTION,
)

_ATTNRES_OPSET = onnxscript.values.Opset(DOMAIN, OPSET_VERSION)
_AGGREGATE_OP = onnxscript.values.Op(_ATTNRES_OPSET, AGGREGATE, aggregate_trace_schema())
_RESIDUAL_ATTENTION_OP = onnxscript.values.Op(_ATTNRES_OPSET, RESIDUAL_ATTENTION, residual_attention_schema())


def _translate_aggregate(score_weight, sources, eps: float):
    return _AGGREGATE_OP(
        score_weight, *sources, eps=eps, plugin_version=PLUGIN_VERSION, plugin_namespace=PLUGIN_NAMESPACE
    )


def _translate_residual_attention(q, k, v, prev_scores, mask_bias, scale: float, logit_divisor: float):
    """One node with two outputs; an absent optional input becomes an empty input name."""
    return _RESIDUAL_ATTENTION_OP(
        q, k, v, prev_scores, mask_bias, scale=scale, logit_divisor=logit_divisor,
        plugin_version=PLUGIN_VERSION, plugin_namespace=PLUGIN_NAMESPACE,
    )


def translation_table() -> dict:
    """The custom-op translations torch.onnx needs for the attnres op set."""
    return {
        torch.ops.attnres.aggregate.default: _translate_aggregate,
        torch.ops.attnres.residual_score_attention.default: _translate_residual_attention,
    }


def export_module(
    module: nn.Module,
    example_inputs: dict[str, torch.Tensor],
    dynamic_dims: dict[str, dict[int, tuple[str, DimRange]]],
    output_names: list[str],
    opset: int,
) -> onnx.ModelProto:
    """Trace ``module`` with dynamic dims and return the ONNX model (no file is written here)."""
    register_schemas()
    dynamic_shapes = {
        name: {axis: torch.export.Dim(dim_name, min=rng.min, max=rng.max) for axis, (dim_name, rng) in axes.items()}
        for name, axes in dynamic_dims.items()
    }
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module,
                (),
                kwargs=example_inputs,
                dynamo=True,
                custom_translation_table=translation_table(),
                dynamic_shapes=dynamic_shapes,
                input_names=list(example_inputs),
                output_names=output_names,
                opset_version=opset,
                optimize=True,
                verbose=False,
            )
    except Exception as exc:
        raise ExportError(f"torch.onnx.export failed: {_summary(exc)} (run with --debug for the full trace)") from exc
    model = program.model_proto
    _name_dynamic_dims(model, dynamic_dims)
    return model


def _name_dynamic_dims(model: onnx.ModelProto, dynamic_dims: dict[str, dict[int, tuple[str, DimRange]]]) -> None:
    """Give the graph inputs' dynamic dims readable names (``batch``, ``seq``) instead of ``s77``."""
    renames: dict[str, str] = {}
    for value in model.graph.input:
        for axis, (dim_name, _) in dynamic_dims.get(value.name, {}).items():
            dim = value.type.tensor_type.shape.dim[axis]
            if dim.dim_param:
                renames[dim.dim_param] = dim_name
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]


def _summary(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"
