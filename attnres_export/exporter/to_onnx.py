"""torch.nn.Module -> ONNX through ``torch.onnx.export(dynamo=True)``, one attnres node per custom-op call.

onnxscript (and the optimizer built on it) is imported by the functions that trace: an export whose trace comes from
the trace cache (``exporter/trace_cache.py``) imports neither it nor ``torch.onnx``, about a second of imports."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

import onnx
import onnx_ir as ir
import torch
from torch import nn

from attnres_export.dims import DimRange
from attnres_export.errors import ExportError
from attnres_export.graphs.schemas import register_schemas, trace_schema
from attnres_export.ops.descriptors import OPS, PLUGIN_ATTRIBUTES
from attnres_export.ops.opset import DOMAIN, OPSET_VERSION


def translation_table() -> dict:
    """The custom-op translations torch.onnx needs: one per op descriptor, keyed by its torch custom op."""
    import onnxscript

    opset = onnxscript.values.Opset(DOMAIN, OPSET_VERSION)
    table = {}
    for op in OPS.values():
        namespace, name = op.torch_op.split("::")
        torch_op = getattr(getattr(torch.ops, namespace), name).default
        table[torch_op] = op.translation(onnxscript.values.Op(opset, op.op_type, trace_schema(op)), PLUGIN_ATTRIBUTES)
    return table


def quiet_torch_onnx_export(model, args: tuple, **options):
    """``torch.onnx.export(dynamo=True)`` and our optimizer (``exporter/optimize.py``: onnxscript's rewrite rules
    would drop a small eps), with the console chatter captured; a failure becomes one ExportError naming the root
    cause. The exporter's logger level is restored afterwards."""
    from attnres_export.exporter.optimize import optimize_exported

    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(model, args, dynamo=True, optimize=False, verbose=False, **options)
            optimize_exported(program.model)
            return program
    except Exception as exc:
        raise ExportError(f"torch.onnx.export failed: {_summary(exc)} (run with --debug for the full trace)") from exc
    finally:
        logger.setLevel(level)


def export_module(
    module: nn.Module,
    example_inputs: dict[str, torch.Tensor],
    dynamic_dims: dict[str, dict[int, tuple[str, DimRange]]],
    output_names: list[str],
    opset: int,
) -> ir.Model:
    """Trace ``module`` with dynamic dims and return the ONNX model as onnx_ir holds it: its initializers still
    share the module's tensors (nothing is written or serialized here; see ``name_dynamic_dims``)."""
    register_schemas()
    dynamic_shapes = {
        name: {axis: torch.export.Dim(dim_name, min=rng.min, max=rng.max) for axis, (dim_name, rng) in axes.items()}
        for name, axes in dynamic_dims.items()
    }
    program = quiet_torch_onnx_export(
        module, (), kwargs=example_inputs, custom_translation_table=translation_table(),
        dynamic_shapes=dynamic_shapes, input_names=list(example_inputs), output_names=output_names,
        opset_version=opset,
    )
    return program.model


def name_dynamic_dims(model: onnx.ModelProto, dynamic_dims: dict[str, dict[int, tuple[str, DimRange]]]) -> None:
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
