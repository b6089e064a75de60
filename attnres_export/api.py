"""The Python API, for models that exist only in a Python process (Hugging Face models with remote code,
research code): the same pipeline and the same result objects as ``attnres-export``, ``attnres fuse`` and
``attnres check``.

    from attnres_export.api import check, export, fuse

    result = export(model, (input_ids,), "model.onnx")      # ForeignExportResult: .path, .report, .fusion
    fusion, report = fuse(onnx.load("plain.onnx"))           # FusionResult (.model, .fused_by_op), Report
    report = check("model.pt", onnx=["model.tensorrt.onnx"]) # Report: .ok, .checks, .to_dict()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from attnres_export.atomic import check_outputs
from attnres_export.dims import DimRange
from attnres_export.dtypes import Tolerance
from attnres_export.exporter.foreign import ForeignExportResult, export_source, module_source, refuse_unfused
from attnres_export.exporter.options import DEFAULT_OPSET, ExportOptions, export_outputs, validate_options
from attnres_export.graphs.fusion import FusionResult, random_feeds
from attnres_export.graphs.validate import validate_attnres_nodes
from attnres_export.parity.check import check_artifacts
from attnres_export.parity.fusion_checks import fuse_and_check
from attnres_export.parity.report import Report


def export(module: nn.Module, example_inputs: tuple | Mapping[str, torch.Tensor], output: str | Path, *,
           target: str = "tensorrt", opset: int = DEFAULT_OPSET, dynamic_shapes: dict | tuple | None = None,
           check: bool = True, seed: int = 0, strict: bool = False,
           tolerances: Mapping[str, Tolerance] | None = None) -> ForeignExportResult:
    """Export ``module`` (float32, eval mode) to ONNX with its depth aggregations fused, checked against the module
    itself on ``example_inputs`` (positional tensors, or keyword tensors by argument name).

    ``dynamic_shapes`` is passed to ``torch.export`` as is. A model that misses its bar is written to
    ``OUT.failed.onnx`` and ``result.report.ok`` is False; errors are ``attnres_export.errors.AttnresError``.
    """
    args, kwargs = ((), dict(example_inputs)) if isinstance(example_inputs, Mapping) else (tuple(example_inputs), {})
    opts = ExportOptions(source=Path(f"<{type(module).__name__}>"), output=Path(output), target=target, opset=opset,
                         batch=DimRange(1, 1, 1), check=check, seed=seed, tolerances=dict(tolerances or {}))
    validate_options(opts)
    check_outputs(export_outputs(opts.output), {})
    source = module_source(module.eval().float(), args, kwargs, dynamic_shapes, opset)
    return export_source(source, opts, strict)


def fuse(model: onnx.ModelProto | str | Path, *, feeds: Mapping[str, np.ndarray] | None = None,
         example_shapes: Mapping[str, list[int]] | None = None, vocab: int | None = None, seed: int = 0,
         check: bool = True, strict: bool = False) -> tuple[FusionResult, Report | None]:
    """Fuse the sites of every fusion pattern in an ONNX model (depth aggregations, residual-score attention);
    ``fusion.model`` is the fused model, ``fusion.fused_by_op`` the fused nodes per op (nothing is written).

    ``feeds`` drive the reference run (random ones from the declared shapes, or ``example_shapes``, by default);
    with ``check`` the fused model is compared with the original on them.
    """
    if not isinstance(model, onnx.ModelProto):
        from attnres_export.graphs.load import load_onnx

        model = load_onnx(Path(model))
    validate_attnres_nodes(model)
    inputs = dict(feeds) if feeds is not None else random_feeds(model, seed, dict(example_shapes or {}), vocab)
    fusion, report = fuse_and_check(model, inputs, seed=seed, check=check)
    refuse_unfused(fusion, strict)
    return fusion, report


def check(checkpoint: str | Path, onnx: Sequence[str | Path] = (), engines: Sequence[str | Path] = (), *,
          shapes: Sequence[tuple[int, ...]] = (), seed: int = 0, tolerances: Mapping[str, Tolerance] | None = None,
          ort_provider: str = "cpu", plugin: str | Path | None = None,
          allow_engine_host_code: bool = False) -> Report:
    """``attnres check``: every ONNX file (on ONNX Runtime) and TensorRT engine against the attnres checkpoint it
    was exported from, on the same inputs; ``report.ok`` is False when an output missed its bar.

    ``shapes`` are (batch, seq), or (batch, seq, past) for with-past graphs (default: two shapes inside the
    exported ranges). A checkpoint that is not the one an artifact came from, or a shape outside its ranges,
    raises ``attnres_export.errors.ParityError`` with one line naming the mismatch.
    """
    result = check_artifacts(Path(checkpoint), [Path(p) for p in onnx], [Path(p) for p in engines],
                             shapes=[tuple(s) for s in shapes], seed=seed, tolerances=dict(tolerances or {}),
                             ort_provider=ort_provider, plugin=Path(plugin) if plugin is not None else None,
                             allow_engine_host_code=allow_engine_host_code)
    return result.report
