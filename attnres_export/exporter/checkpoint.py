"""The attnres-checkpoint pipeline: load, trace (plain or with-past graph), stamp, convert for the target, check
against the float64 PyTorch model on ONNX Runtime CPU, publish (docs/architecture.md#the-path-of-a-model)."""

from __future__ import annotations

import gc
import json
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import torch

from attnres_export import __version__
from attnres_export.atomic import check_outputs, temporary_dir_beside
from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.dims import DimRange
from attnres_export.errors import ExportError
from attnres_export.exporter.assemble import export_planned, plan_of
from attnres_export.exporter.collection import collect_everything, collecting_new_objects_only
from attnres_export.exporter.options import (
    ExportOptions,
    ExportResult,
    export_outputs,
    failed_path,
    refuse_default_output_of_another_source,
    validate_options,
)
from attnres_export.exporter.staging import Stage
from attnres_export.exporter.to_onnx import export_module, name_dynamic_dims
from attnres_export.graphs.metadata import EXPORT_KEY
from attnres_export.graphs.onnx_utils import attnres_nodes, set_metadata
from attnres_export.graphs.targets import convert
from attnres_export.models import load_checkpoint
from attnres_export.models.base import fingerprint
from attnres_export.models.checkpoint import model_as, stored_as
from attnres_export.models.registry import architecture_of
from attnres_export.ops.opset import OPSET_VERSION
from attnres_export.parity.check import ArtifactRun, References, default_shapes, judge_artifacts, reference_outputs
from attnres_export.parity.feeds import checkpoint_subject
from attnres_export.parity.metrics import tolerance_for
from attnres_export.parity.report import Report
from attnres_export.parity.routing import with_artifact_routing


@dataclass
class _Job:
    """What one export traces, how it is stamped and what checks it: the plain graph or the with-past one."""

    ranges: dict[str, DimRange]
    trace: Callable[[Callable[[str], None]], ir.Model] | None
    """Traces (or assembles) the export model, reporting its phases; dropped once used, so that the model can be
    released."""
    dynamic_dims: dict[str, dict[int, tuple[str, DimRange]]]
    metadata: dict
    expected_nodes: int
    shapes: list[tuple[int, ...]]
    reference_model: Callable[[], torch.nn.Module]
    with_past: bool
    """Which graph the check feeds (parity/feeds.py: checkpoint_subject)."""
    report_extra: dict


def export_checkpoint(opts: ExportOptions, status: Callable[[str], None] = lambda _: None) -> ExportResult:
    """Export ``opts.source``; raises AttnresError subclasses with one-line messages on bad input.

    Memory (docs/benchmarks.md, "CPU: export memory"): the checkpoint is loaded in its stored types and traced
    without a copy when it is stored in the export dtype (``_models``); the traced weights go straight to the
    staging folder's data file; the PyTorch references run before ONNX Runtime opens the staged file, and the
    model is released between."""
    validate_options(opts)
    out = opts.resolved_output()
    check_outputs(export_outputs(out), {"MODEL": opts.source})
    refuse_default_output_of_another_source(opts)
    status(f"loading {opts.source}")
    job = _job(*_models(opts), opts)
    with temporary_dir_beside(out) as folder, collecting_new_objects_only():
        stage = Stage(folder, out.name)
        traced = job.trace(status)
        job.trace = None
        status("writing the weights to the staging folder")
        graph = stage.write_traced(traced)
        del traced
        gc.collect()  # the traced graph is cyclic and may hold folded weights (a whole-model trace's transposes)
        status(f"stamping the metadata and converting for the {opts.target} target")
        name_dynamic_dims(graph, job.dynamic_dims)
        graph, fused, fused_by_type = _stamp_and_convert(graph, job.expected_nodes, opts, job.ranges, job.metadata)
        stage.write_graph(graph)
        del graph
        report = None
        if opts.check:
            references = _reference_outputs(job, opts, status)
            report_extra = job.report_extra
            del job
            collect_everything()
            report = _check_staged(stage.path, out.name, references, opts, status)
            report = with_artifact_routing(report, stage.path, out.name, references,
                                           lambda: load_checkpoint(opts.source, dtype=None)[0],
                                           tolerance_for(opts.dtype, opts.tolerances),
                                           lambda what: status(f"parity: {what}"))
            report.extra.update(report_extra)
        target = out if report is None or report.ok else failed_path(out)
        status(f"checking and writing {target}")
        files = stage.publish(target)
    if report is not None:
        report.extra.update({"target": opts.target, "dtype": opts.dtype, "fused_nodes": fused, "onnx": str(target)})
    return ExportResult(target, files, fused, fused, report, fused_by_type)


def _models(opts: ExportOptions) -> tuple[torch.nn.Module, Callable[[], torch.nn.Module], Any, str]:
    """The model to trace, how to get the reference model, the config, and the model's fingerprint (of the weights
    as stored, so that every export of one checkpoint records the same identity).

    A checkpoint stored in the export dtype is one model for both. Otherwise the stored weights and the cast
    ones are never resident together: the traced model is loaded cast (the file mapped group by group), and the
    reference is mapped again when the references run, after the traced model is gone."""
    model, cfg = load_checkpoint(opts.source, dtype=None)
    model_id = fingerprint(model)
    if stored_as(model, opts.dtype):
        return model, lambda: model, cfg, model_id
    model = None  # the stored weights go before the cast copy is made
    traced, _ = load_checkpoint(opts.source, dtype=opts.dtype)
    return traced, lambda: load_checkpoint(opts.source, dtype=None)[0], cfg, model_id


def _job(traced: torch.nn.Module, reference_model: Callable[[], torch.nn.Module], cfg: Any, model_id: str,
         opts: ExportOptions) -> _Job:
    if opts.fuse_norm and not (architecture_of(traced).capabilities.fuse_norm and traced.aggregation_count()):
        raise ExportError(f"--fuse-norm: this {cfg.arch} model has no depth aggregations to fuse with their norm; "
                          "drop --fuse-norm")
    if opts.with_past:
        return _with_past_job(traced, reference_model, cfg, model_id, opts)
    if opts.past is not None:
        raise ExportError("--past needs --with-past")
    seq = opts.seq or DimRange(1, min(64, cfg.max_seq_len), cfg.max_seq_len)
    if seq.max > cfg.max_seq_len:
        raise ExportError(f"--seq max {seq.max} exceeds the model's max_seq_len {cfg.max_seq_len}; lower it")
    ranges = {"batch": opts.batch, "seq": seq}
    inputs = {name: [axes[a] for a in sorted(axes)] for name, axes in traced.input_axes.items()}
    dynamic = {name: {axis: (dim, ranges[dim]) for axis, dim in axes.items() if ranges[dim].min < ranges[dim].max}
               for name, axes in traced.input_axes.items()}
    metadata = {"arch": cfg.arch, "inputs": inputs, "config": cfg.to_dict(), "model_id": model_id}
    return _Job(ranges, lambda status: _export(traced, ranges, dynamic, opts, status), dynamic, metadata,
                traced.fused_node_count(), _check_shapes(ranges, False), reference_model, False, {})


def _with_past_job(traced: torch.nn.Module, reference_model: Callable[[], torch.nn.Module], cfg: Any,
                   model_id: str, opts: ExportOptions) -> _Job:
    from attnres_export.exporter.with_past import dynamic_dims_with_past, export_with_past, with_past_ranges
    from attnres_export.models.base import step_input_axes

    wrapper = traced.with_past()
    if wrapper is None:
        raise ExportError(f"--with-past: {cfg.arch} models have no KV cache (encoders and models without decode "
                          "state); drop --with-past")
    ranges = with_past_ranges(opts.batch, opts.seq, opts.past, cfg.max_seq_len)
    cache = wrapper.cache_inputs()
    metadata = {"arch": cfg.arch, "with_past": True, "inputs": step_input_axes(cache),
                "cache": [{"name": c.name, "present": c.present, "axes": list(c.axes), "dtype": c.dtype}
                          for c in cache],
                "vocab_size": cfg.vocab_size, "max_seq_len": cfg.max_seq_len, "config": cfg.to_dict(),
                "model_id": model_id, **wrapper.metadata()}
    dynamic = dynamic_dims_with_past(step_input_axes(cache), ranges)
    return _Job(ranges, lambda status: export_with_past(traced, ranges, opts.dtype, opts.opset, opts.seed,
                                                        opts.fuse_norm, opts.trace_whole, status)[0], dynamic,
                metadata, traced.fused_node_count(), _check_shapes(ranges, True), reference_model, True,
                {"with_past": True, "shapes": "batch x seq x past"})


def _check_shapes(ranges: dict[str, DimRange], with_past: bool) -> list[tuple[int, ...]]:
    """The shapes the export's check runs: those ``attnres check`` picks for the ranges written into the file."""
    return default_shapes({name: rng.as_list() for name, rng in ranges.items()}, with_past)


def _stamp_and_convert(onnx_model: onnx.ModelProto, expected: int, opts: ExportOptions,
                       ranges: dict[str, DimRange], extra_meta: dict
                       ) -> tuple[onnx.ModelProto, int, dict[str, int]]:
    """Check the export fused every aggregation the model has, stamp the export metadata, and convert the
    fused nodes to the target's form: ``(model, fused, fused_by_type)``."""
    fused_nodes = attnres_nodes(onnx_model.graph)
    fused, fused_by_type = len(fused_nodes), dict(Counter(n.op_type for n in fused_nodes))
    if fused != expected:
        raise ExportError(f"expected {expected} attnres nodes, the export has {fused} ({fused_by_type}); "
                          "please report this")
    meta = {"attnres_version": __version__, "op_set_version": OPSET_VERSION, "dtype": opts.dtype,
            "target": opts.target, "dims": {k: v.as_list() for k, v in ranges.items()},
            "source_file": opts.source.name, **extra_meta}
    set_metadata(onnx_model, EXPORT_KEY, json.dumps(meta))
    if fused:
        onnx_model = convert(onnx_model, opts.target)
    return onnx_model, fused, fused_by_type


def check_export(model: torch.nn.Module, path: Path, opts: ExportOptions,
                 status: Callable[[str], None] = lambda _: None) -> Report:
    """The parity check ``attnres-export`` runs on its staged file, run on the ONNX file at ``path``."""
    job = _job(model, lambda: model, model.config, fingerprint(model), opts)
    return _check_staged(path, path.name, _reference_outputs(job, opts, status), opts, status)


def _reference_outputs(job: _Job, opts: ExportOptions, status: Callable[[str], None]) -> References:
    """Step 1 of the check (parity/check.py), on the reference model of ``job`` at its check shapes."""
    subject = checkpoint_subject(job.reference_model(), job.with_past, opts.dtype, opts.seed)
    return reference_outputs(subject, job.shapes, lambda what: status(f"parity: {what}"), [opts.dtype])


def _check_staged(path: Path, artifact: str, references: References, opts: ExportOptions,
                  status: Callable[[str], None]) -> Report:
    """Step 2 of the check: the staged ONNX on ONNX Runtime CPU against the PyTorch outputs, at a bar that scales
    with float32 PyTorch's own error when there are float64 outputs (docs/parity.md#pass-bars)."""
    run = ArtifactRun(lambda: OnnxRuntimeRunner(path, artifact=artifact), opts.dtype,
                      tolerance_for(opts.dtype, opts.tolerances), references)
    return judge_artifacts([run], lambda what: status(f"parity: {what}"))


def _export(model: torch.nn.Module, ranges: dict[str, DimRange],
            dynamic: dict[str, dict[int, tuple[str, DimRange]]], opts: ExportOptions,
            status: Callable[[str], None]) -> ir.Model:
    """The ONNX model of ``model`` in the export dtype (the model itself when its weights are stored in it: no
    copy): assembled from its export plan, or traced whole when its family has none or ``opts.trace_whole``."""
    export_model = model_as(model, opts.dtype)
    trace_sizes = {name: _trace_size(rng) for name, rng in ranges.items()}
    plan = None if opts.trace_whole else plan_of(export_model, with_past=False, fuse_norm=opts.fuse_norm)
    if plan is not None:
        return export_planned(export_model, plan, ranges, trace_sizes, opts.dtype, opts.opset, status)
    status(f"tracing the whole model ({opts.dtype}, opset {opts.opset})")
    feeds = model.random_inputs(trace_sizes["batch"], trace_sizes["seq"], np.random.default_rng(opts.seed))
    example = {k: torch.from_numpy(v) for k, v in feeds.items()}
    with export_model.score_weights_folded(), export_model.norms_fused() if opts.fuse_norm else nullcontext():
        return export_module(export_model, example, dynamic, list(model.output_names), opts.opset)


def _trace_size(rng: DimRange) -> int:
    """torch.export specialises sizes 0 and 1, so a dynamic dim is traced at a size of at least 2."""
    if rng.min == rng.max:
        return rng.min
    return min(max(rng.opt, 2), rng.max)
