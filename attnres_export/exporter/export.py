"""``attnres-export``: checkpoint -> ONNX for a target and dtype, then the parity check on ONNX Runtime CPU."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch

from attnres_export import __version__
from attnres_export.atomic import check_outputs
from attnres_export.backends.onnxruntime_runner import OnnxRuntimeRunner
from attnres_export.backends.torch_runner import TorchRunner
from attnres_export.dims import DimRange
from attnres_export.dtypes import STORAGE_TYPES, Tolerance, torch_dtype
from attnres_export.errors import ExportError
from attnres_export.exporter.save import save_onnx_atomic
from attnres_export.exporter.to_onnx import export_module
from attnres_export.graphs.metadata import EXPORT_KEY
from attnres_export.graphs.onnx_utils import attnres_nodes, set_metadata
from attnres_export.graphs.targets import convert
from attnres_export.models import load_checkpoint
from attnres_export.ops.opset import OPSET_VERSION
from attnres_export.parity.metrics import tolerance_for
from attnres_export.parity.report import Report, run_checks

DEFAULT_OPSET = 18
SUPPORTED_OPSETS = range(18, 24)


@dataclass
class ExportOptions:
    checkpoint: Path
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

    def resolved_output(self) -> Path:
        if self.output is not None:
            return self.output
        suffix = ("" if self.dtype == "float32" else f".{self.dtype}") + (".with-past" if self.with_past else "")
        stem = self.checkpoint.name if self.checkpoint.is_dir() else self.checkpoint.stem
        return self.checkpoint.with_name(f"{stem}{suffix}.{self.target}.onnx")


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


def export_checkpoint(opts: ExportOptions, status: Callable[[str], None] = lambda _: None) -> ExportResult:
    """Export ``opts.checkpoint``; raises AttnresError subclasses with one-line messages on bad input."""
    validate_options(opts)
    check_outputs({"-o": opts.resolved_output()}, {"MODEL": opts.checkpoint})
    status(f"loading {opts.checkpoint}")
    model, cfg = load_checkpoint(opts.checkpoint)
    if opts.with_past:
        return _export_with_past(model, cfg, opts, status)
    if opts.past is not None:
        raise ExportError("--past needs --with-past")
    seq = opts.seq or DimRange(1, min(64, cfg.max_seq_len), cfg.max_seq_len)
    if seq.max > cfg.max_seq_len:
        raise ExportError(f"--seq max {seq.max} exceeds the model's max_seq_len {cfg.max_seq_len}; lower it")
    ranges = {"batch": opts.batch, "seq": seq}

    status(f"tracing and exporting to ONNX ({opts.dtype}, opset {opts.opset})")
    onnx_model = _export(model, ranges, opts)
    inputs = {name: [axes[a] for a in sorted(axes)] for name, axes in model.input_axes.items()}
    onnx_model, fused, fused_by_type, expected = _stamp_and_convert(
        onnx_model, model, opts, ranges, {"arch": cfg.arch, "inputs": inputs})

    out = opts.resolved_output()
    report = check_export(model, onnx_model, out, ranges, opts, status) if opts.check else None
    out, files = publish(onnx_model, out, report, status)
    if report is not None:
        report.extra.update({"target": opts.target, "dtype": opts.dtype, "fused_nodes": fused, "onnx": str(out)})
    return ExportResult(out, files, fused, expected, report, fused_by_type)


def _export_with_past(model: torch.nn.Module, cfg, opts: ExportOptions, status: Callable[[str], None]
                      ) -> ExportResult:
    from attnres_export.exporter.with_past import (
        check_shapes_with_past,
        export_with_past,
        past_feed_maker,
        with_past_ranges,
    )

    ranges = with_past_ranges(opts.batch, opts.seq, opts.past, cfg.max_seq_len)
    status(f"tracing and exporting the with-past graph to ONNX ({opts.dtype}, opset {opts.opset})")
    onnx_model, reference = export_with_past(model, ranges, opts.dtype, opts.opset, opts.seed)
    onnx_model, fused, fused_by_type, expected = _stamp_and_convert(
        onnx_model, model, opts, ranges,
        {"arch": cfg.arch, "with_past": True, "inputs": reference.input_axes(), "n_layers": cfg.n_layers,
         "n_heads": cfg.n_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
         "max_seq_len": cfg.max_seq_len})
    out = opts.resolved_output()
    report = None
    if opts.check:
        from attnres_export.models.attnres_lm import WithPastFeeds

        output_names = reference.output_names()
        runner = OnnxRuntimeRunner(onnx_model, artifact=out.name)
        tol = tolerance_for(opts.dtype, opts.tolerances)
        report = run_checks(TorchRunner(WithPastFeeds(reference), output_names), [(runner, opts.dtype, tol)],
                            check_shapes_with_past(ranges), past_feed_maker(reference, opts.dtype, opts.seed),
                            progress=lambda what: status(f"parity: {what}"))
    out, files = publish(onnx_model, out, report, status)
    if report is not None:
        report.extra.update({"target": opts.target, "dtype": opts.dtype, "fused_nodes": fused, "onnx": str(out),
                             "with_past": True, "shapes": "batch x seq x past"})
    return ExportResult(out, files, fused, expected, report, fused_by_type)


def _stamp_and_convert(onnx_model: onnx.ModelProto, model: torch.nn.Module, opts: ExportOptions,
                       ranges: dict[str, DimRange], extra_meta: dict
                       ) -> tuple[onnx.ModelProto, int, dict[str, int], int]:
    """Check the export fused every aggregation the model has, stamp the export metadata, and convert the
    fused nodes to the target's form: ``(model, fused, fused_by_type, expected)``."""
    fused_nodes = attnres_nodes(onnx_model.graph)
    fused, fused_by_type = len(fused_nodes), dict(Counter(n.op_type for n in fused_nodes))
    expected = model.fused_node_count()
    if fused != expected:
        raise ExportError(f"expected {expected} attnres nodes, the export has {fused} ({fused_by_type}); "
                          "please report this")
    meta = {"attnres_version": __version__, "op_set_version": OPSET_VERSION, "dtype": opts.dtype,
            "target": opts.target, "dims": {k: v.as_list() for k, v in ranges.items()}, **extra_meta}
    set_metadata(onnx_model, EXPORT_KEY, json.dumps(meta))
    if fused:
        onnx_model = convert(onnx_model, opts.target)
    return onnx_model, fused, fused_by_type, expected


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


def _export(model: torch.nn.Module, ranges: dict[str, DimRange], opts: ExportOptions) -> onnx.ModelProto:
    export_copy = copy.deepcopy(model)
    export_copy.fold_score_weights()
    export_copy.to(torch_dtype(opts.dtype))
    trace_sizes = {name: _trace_size(rng) for name, rng in ranges.items()}
    feeds = model.random_inputs(trace_sizes["batch"], trace_sizes["seq"], np.random.default_rng(opts.seed))
    dynamic = {
        name: {axis: (dim, ranges[dim]) for axis, dim in axes.items() if ranges[dim].min < ranges[dim].max}
        for name, axes in model.input_axes.items()
    }
    example = {k: torch.from_numpy(v) for k, v in feeds.items()}
    return export_module(export_copy, example, dynamic, list(model.output_names), opts.opset)


def _trace_size(rng: DimRange) -> int:
    """torch.export specialises sizes 0 and 1, so a dynamic dim is traced at a size of at least 2."""
    if rng.min == rng.max:
        return rng.min
    return min(max(rng.opt, 2), rng.max)


def check_shapes(ranges: dict[str, DimRange]) -> list[tuple[int, int]]:
    """Two (batch, seq) shapes inside the ranges: the optimum, and the largest batch with the fewest tokens
    (a single token whenever the range allows it)."""
    batch, seq = ranges["batch"], ranges["seq"]
    shapes = [(batch.opt, seq.opt), (batch.max, seq.min)]
    return list(dict.fromkeys(shapes))


def check_export(
    model: torch.nn.Module,
    onnx_model: onnx.ModelProto,
    path: Path,
    ranges: dict[str, DimRange],
    opts: ExportOptions,
    status: Callable[[str], None],
) -> Report:
    """Run the written ONNX on ONNX Runtime CPU against a float64 copy of the PyTorch model on the same inputs,
    at a bar that scales with the float32 PyTorch model's own error (docs/parity.md#pass-bars)."""
    output_names = list(model.output_names)

    def feeds(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        return model.random_inputs(shape[0], shape[1], np.random.default_rng([opts.seed, *shape]))

    runner = OnnxRuntimeRunner(onnx_model, artifact=path.name)
    tol = tolerance_for(opts.dtype, opts.tolerances)
    return run_checks(TorchRunner(model, output_names), [(runner, opts.dtype, tol)], check_shapes(ranges), feeds,
                      progress=lambda what: status(f"parity: {what}"),
                      precise=TorchRunner(model, output_names, dtype="float64"))
