"""The export entry: one function for every kind of model file (docs/architecture.md#the-path-of-a-model).

An attnres checkpoint (a ``.pt`` file or a checkpoint folder) goes through ``exporter/checkpoint.py``; a model
written elsewhere (``.pt2`` program, ONNX file, trusted pickle) through ``exporter/foreign.py``.
"""


from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from attnres_export.atomic import check_outputs
from attnres_export.errors import ExportError, PickledModelError
from attnres_export.exporter.options import (
    ExportOptions,
    ExportResult,
    export_outputs,
    refuse_default_output_of_another_source,
    validate_options,
)

if TYPE_CHECKING:
    from attnres_export.exporter.foreign import ForeignOptions
    from attnres_export.models.store import Checkpoint


def model_kind(path: Path) -> str:
    """``onnx``, ``program`` (.pt2) or ``checkpoint`` (anything else: a ``.pt`` that turns out to hold a whole
    pickled object is found when it is opened, ``PickledModelError``)."""
    if path.suffix == ".onnx":
        return "onnx"
    if path.suffix == ".pt2":
        return "program"
    return "checkpoint"


def export_any(opts: ExportOptions, foreign: ForeignOptions, status: Callable[[str], None] = lambda _: None,
               checkpoint: Checkpoint | None = None) -> ExportResult:
    """Export an attnres checkpoint (``checkpoint``: the source, already opened by the caller), or a foreign model
    through pattern fusion."""
    from attnres_export.exporter.checkpoint import export_checkpoint
    from attnres_export.exporter.foreign import export_source, load_foreign

    kind = model_kind(opts.source)
    if kind == "checkpoint":
        try:
            return export_checkpoint(opts, status, checkpoint)
        except PickledModelError:
            kind = "pickle"
    if opts.with_past or opts.past is not None:
        raise ExportError(f"--with-past: export from an attnres checkpoint (.pt or a checkpoint folder); "
                          f"{opts.source.name} is a foreign model ({kind}), which is exported as it is")
    if opts.quantize is not None:
        raise ExportError(f"--quantize: only checkpoints (.pt or a checkpoint folder) are quantized on export; "
                          f"{opts.source.name} is a foreign model ({kind}); drop --quantize")
    if opts.fuse_norm:
        raise ExportError(f"--fuse-norm: only attnres checkpoints are exported with fused norms; "
                          f"{opts.source.name} is a foreign model ({kind}); drop --fuse-norm")
    validate_options(opts)
    check_outputs(export_outputs(opts.resolved_output()), {"MODEL": opts.source})
    refuse_default_output_of_another_source(opts)
    if opts.dtype != "float32" and kind == "onnx":
        raise ExportError("--dtype: an ONNX file is exported in its own precision; export the source model in "
                          f"{opts.dtype} (or give attnres-export its .pt2 program) to change it")
    status(f"loading {opts.source}")
    return export_source(load_foreign(kind, opts, foreign), opts, foreign.strict, status)
