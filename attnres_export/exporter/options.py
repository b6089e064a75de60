"""What an export is asked for and what it returns, checked before any model is read."""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from attnres_export.dims import DimRange
from attnres_export.dtypes import STORAGE_TYPES, Tolerance
from attnres_export.errors import ExportError
from attnres_export.graphs.save import save_onnx_atomic
from attnres_export.parity.report import Report

DEFAULT_OPSET = 18
SUPPORTED_OPSETS = range(18, 24)


@dataclass
class ExportOptions:
    source: Path
    """The model file or folder to export: an attnres checkpoint, a .pt2 program, an ONNX file or a pickled module."""
    output: Path | None = None
    target: str = "tensorrt"
    dtype: str = "float32"
    opset: int = DEFAULT_OPSET
    batch: DimRange = field(default_factory=lambda: DimRange(1, 1, 8))
    seq: DimRange | None = None
    check: bool = True
    seed: int = 0
    tolerances: dict[str, Tolerance] = field(default_factory=dict)
    with_past: bool = False
    """Export the KV-cache graph (docs/decode.md): past_key_values in, presents out."""
    past: DimRange | None = None
    fuse_norm: bool = False
    """Export each aggregation and the RMSNorm after it as one AttnResAggregateNorm node."""
    trace_whole: bool = False
    """Trace the whole model, even when its family has an export plan (docs/exporter-notes.md#assembled-export)."""

    def resolved_output(self) -> Path:
        if self.output is not None:
            return self.output
        suffix = ("" if self.dtype == "float32" else f".{self.dtype}") + (".with-past" if self.with_past else "")
        stem = self.source.name if self.source.is_dir() else self.source.stem
        return self.source.with_name(f"{stem}{suffix}.{self.target}.onnx")


@dataclass
class ExportResult:
    path: Path
    files: list[Path]
    fused_nodes: int
    expected_aggregations: int
    report: Report | None
    fused_by_type: dict[str, int] = field(default_factory=dict)


def validate_options(opts: ExportOptions) -> None:
    if opts.target not in ("tensorrt", "portable"):
        raise ExportError(f"--target {opts.target!r}: choose tensorrt or portable (ort-trt: `attnres convert`)")
    if opts.dtype not in STORAGE_TYPES:
        raise ExportError(f"--dtype {opts.dtype!r}: choose one of {', '.join(STORAGE_TYPES)}")
    if opts.opset not in SUPPORTED_OPSETS:
        raise ExportError(
            f"--opset {opts.opset}: supported are {SUPPORTED_OPSETS.start}..{SUPPORTED_OPSETS.stop - 1}"
        )


def failed_path(out: Path) -> Path:
    """Where a model that missed its parity bar is kept: ``OUT.failed.onnx`` beside ``OUT``."""
    return out.with_name(f"{out.stem}.failed{out.suffix or '.onnx'}")


def publish(model: onnx.ModelProto, out: Path, report: Report | None,
            status: Callable[[str], None]) -> tuple[Path, list[Path]]:
    """Write ``model`` to ``out`` when its check passed (or did not run), else to ``OUT.failed.onnx``: a model
    that failed its check never replaces a good file (docs/security.md)."""
    target = out if report is None or report.ok else failed_path(out)
    status(f"checking and writing {target}")
    return target, save_onnx_atomic(model, target)
