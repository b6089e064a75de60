"""The attnres-checkpoint pipeline: load, trace (plain or with-past graph), stamp, convert for the target, check
against the float64 PyTorch model on ONNX Runtime CPU, publish (docs/architecture.md#the-path-of-a-model)."""

from __future__ import annotations

import gc
import json
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import torch

from attnres_export import __version__
from attnres_export.atomic import check_outputs, temporary_dir_beside
from attnres_export.backends.onnxruntime.runner import FLOAT_ACTIVATIONS, INT8_ACTIVATIONS
from attnres_export.dims import DimRange
from attnres_export.errors import ExportError
from attnres_export.exporter.assemble import export_planned, plan_of
from attnres_export.exporter.collection import collecting_new_objects_only
from attnres_export.exporter.options import (
    ExportOptions,
    ExportResult,
    export_outputs,
    failed_path,
    refuse_default_output_of_another_source,
    validate_options,
)
from attnres_export.exporter.quantized_graph import MIN_OPSET, QuantizedWeights, keep_quantized
from attnres_export.exporter.staging import Stage
from attnres_export.exporter.to_onnx import export_module, name_dynamic_dims
from attnres_export.exporter.trace_cache import cache_folder
from attnres_export.graphs.load import load_onnx
from attnres_export.graphs.metadata import EXPORT_KEY, INT8_ACTIVATIONS_KEY, QUANTIZE_KEY, export_info
from attnres_export.graphs.onnx_utils import attnres_nodes, set_metadata
from attnres_export.graphs.onnxruntime_ops import OnnxRuntimeOps
from attnres_export.graphs.targets import convert
from attnres_export.models.checkpoint import model_as
from attnres_export.models.registry import architecture_of
from attnres_export.models.store import Checkpoint, open_checkpoint
from attnres_export.ops.opset import OPSET_VERSION
from attnres_export.parity.check import default_shapes
from attnres_export.parity.int8_activations import reference_with
from attnres_export.parity.metrics import tolerance_for
from attnres_export.parity.quantization import quantization_distance
from attnres_export.parity.report import Report
from attnres_export.parity.session import check_onnx, collect_all_garbage


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
    report_extra: dict


def export_checkpoint(opts: ExportOptions, status: Callable[[str], None] = lambda _: None,
                      checkpoint: Checkpoint | None = None) -> ExportResult:
    """Export ``opts.source`` (``checkpoint``: that source, already opened by the caller); raises AttnresError
    subclasses with one-line messages on bad input.

    The checkpoint is opened once and read tensor by tensor (``models.store``): an assembled export leaves every
    large tensor in the file until the staging writer copies it to the data file, so the export holds about one
    tensor at a time (docs/benchmarks.md, "CPU: export memory"); the PyTorch references read the model again from
    the open checkpoint after the traced graph is released, before ONNX Runtime opens the staged file."""
    validate_options(opts)
    out = opts.resolved_output()
    check_outputs(export_outputs(out), {"MODEL": opts.source})
    refuse_default_output_of_another_source(opts)
    status(f"loading {opts.source}")
    if checkpoint is None:
        checkpoint = open_checkpoint(opts.source)
    unquantized, checkpoint = checkpoint, quantized_for(opts, checkpoint)
    if opts.int8_activations and not checkpoint.quantized_formats():
        raise ExportError(f"--int8-activations: {opts.source.name} has no quantized weights for MatMulNBits to "
                          "multiply; add --quantize int4|int8")
    if checkpoint.quantized_formats() and opts.opset < MIN_OPSET:
        status(f"opset {MIN_OPSET}: quantized weights are written as blocked DequantizeLinear")
        opts = replace(opts, opset=MIN_OPSET)
    job = _job(*_models(opts, checkpoint), opts)
    with temporary_dir_beside(out) as folder, collecting_new_objects_only():
        stage = Stage(folder, out.name)
        traced = job.trace(status)
        job.trace = None
        quantized = keep_quantized(traced, opts.dtype, opts.target, opts.matmul_nbits or opts.target == "onnxruntime",
                                   INT8_ACTIVATIONS if opts.int8_activations else FLOAT_ACTIVATIONS)
        if quantized.formats:
            job.metadata["quantized"] = dict(quantized.formats)
        if opts.int8_activations:
            job.metadata[INT8_ACTIVATIONS_KEY] = int8_activation_blocks(checkpoint, quantized)
        if opts.quantize is not None:
            job.metadata[QUANTIZE_KEY] = {"bits": opts.quantize_bits, "block_size": opts.rtn_block_size,
                                          "embeddings": opts.quantize_embeddings}
        status("writing the weights to the staging folder")
        graph = stage.write_traced(traced)
        del traced
        gc.collect()  # the traced graph is cyclic and may hold folded weights (a whole-model trace's transposes)
        status(f"stamping the metadata and converting for the {opts.target} target")
        name_dynamic_dims(graph, job.dynamic_dims)
        graph, fused, fused_by_type = _stamp_and_convert(graph, job.expected_nodes, opts, job.ranges, job.metadata,
                                                         stage.path.parent)
        onnxruntime_ops = OnnxRuntimeOps.of(graph)
        stage.write_graph(graph)
        del graph
        report = None
        if opts.check:
            shapes, report_extra = job.shapes, job.report_extra
            reference = reference_with(lambda: checkpoint.model(None), job.metadata.get(INT8_ACTIVATIONS_KEY))
            del job
            collect_all_garbage()
            report = check_onnx(stage.path, out.name, reference, opts.with_past, opts.dtype, opts.seed, shapes,
                                tolerance_for(opts.dtype, opts.tolerances), status)
            report.extra.update(report_extra)
            if unquantized is not checkpoint:
                status("measuring how far the quantized model is from the unquantized one (float64 PyTorch)")
                report.extra["quantization"] = quantization_distance(
                    reference, lambda: unquantized.model(None), shapes, opts.seed)
        target = out if report is None or report.ok else failed_path(out)
        status(f"checking and writing {target}")
        files = stage.publish(target)
    if report is not None:
        report.extra.update({"target": opts.target, "dtype": opts.dtype, "fused_nodes": fused, "onnx": str(target)})
    return ExportResult(target, files, fused, fused, report, fused_by_type, quantized, onnxruntime_ops)


def int8_activation_blocks(checkpoint: Checkpoint, quantized: QuantizedWeights) -> dict[str, dict]:
    """Each weight ``keep_quantized`` wrote as ``MatMulNBits`` by state_dict name (whose ``Linear``'s input the
    check's reference quantizes): its ``block`` size and its ``packed`` initializer (what finds its node in the
    graph, parity/rounding.py); refuses an export that wrote none."""
    names = {id(stored): name for name, stored in checkpoint.tensors.items()}
    blocks = {}
    for weight, block, packed in quantized.matmul_nbits:
        if id(weight) not in names:
            raise ExportError(f"{weight.where}: a MatMulNBits weight is not one of the model's tensors, so the check "
                              "cannot quantize its input (please report this)")
        blocks[names[id(weight)]] = {"block": block, "packed": packed}
    if not blocks:
        raise ExportError(f"--int8-activations: no weight of {checkpoint.path.name} is written as MatMulNBits (only "
                          "4- and 8-bit integer matrices in blocks of 16 to 256 are; FP8 weights stay "
                          "DequantizeLinear); drop --int8-activations")
    return blocks


def quantized_for(opts: ExportOptions, checkpoint: Checkpoint) -> Checkpoint:
    """``checkpoint`` as ``opts`` exports it: with ``--quantize``, its float matmul weights quantized as they are
    read (the same object again when they already are); int8 for the ``tensorrt`` target per channel, the int8 form
    TensorRT builds (docs/quantization.md#tensorrt)."""
    if opts.quantize is None:
        return checkpoint
    return checkpoint.quantized_on_read(opts.quantize_bits, opts.rtn_block_size, opts.quantize_embeddings)


def _models(opts: ExportOptions, checkpoint: Checkpoint) -> tuple[torch.nn.Module, _Weights, Any, str]:
    """The model to trace, how to read one of its tensors, the config, and the model's fingerprint (of the weights
    as stored, so that every export of one checkpoint records the same identity).

    A model with an export plan is traced with its large tensors left in the checkpoint (``streamed_model``), each
    read when the staging writer writes it; one traced whole is built in the export dtype. Quantized weights are kept
    quantized by the assembled export only (``exporter.quantized_graph``)."""
    model_id = checkpoint.fingerprint()
    streamed = checkpoint.streamed_model(opts.dtype)
    _refuse_fuse_norm_without_aggregations(streamed.module, opts)
    planned = not opts.trace_whole and plan_of(streamed.module, with_past=opts.with_past,
                                               fuse_norm=opts.fuse_norm) is not None
    if planned:
        return streamed.module, _Weights(streamed.read, streamed.stored), checkpoint.config, model_id
    del streamed
    formats = checkpoint.quantized_formats()
    if formats:
        raise ExportError(f"--trace-whole: this checkpoint's {', '.join(formats)} weights are kept quantized by the "
                          "assembled export only; drop --trace-whole")
    return checkpoint.model(opts.dtype), _Weights(_as_held, _not_stored), checkpoint.config, model_id


@dataclass
class _Weights:
    """How the traced model's tensors are read, and which stored tensor each one left in the checkpoint reads."""

    read: Callable[[torch.Tensor], torch.Tensor]
    stored: Callable[[torch.Tensor], object | None]


def _not_stored(tensor: torch.Tensor) -> None:
    return None


def _refuse_fuse_norm_without_aggregations(model: torch.nn.Module, opts: ExportOptions) -> None:
    if opts.fuse_norm and not (architecture_of(model).capabilities.fuse_norm and model.aggregation_count()):
        raise ExportError(f"--fuse-norm: this {model.config.arch} model has no depth aggregations to fuse with their "
                          "norm; drop --fuse-norm")


def _as_held(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _job(traced: torch.nn.Module, weights: _Weights, cfg: Any, model_id: str, opts: ExportOptions) -> _Job:
    if opts.with_past:
        return _with_past_job(traced, weights, cfg, model_id, opts)
    ranges = _ranges(cfg, opts)
    inputs = {name: [axes[a] for a in sorted(axes)] for name, axes in traced.input_axes.items()}
    dynamic = {name: {axis: (dim, ranges[dim]) for axis, dim in axes.items() if ranges[dim].min < ranges[dim].max}
               for name, axes in traced.input_axes.items()}
    metadata = {"arch": cfg.arch, "inputs": inputs, "config": cfg.to_dict(), "model_id": model_id}
    return _Job(ranges, lambda status: _export(traced, weights, ranges, dynamic, opts, status), dynamic, metadata,
                traced.fused_node_count(), _check_shapes(ranges, False), {})


def _ranges(cfg: Any, opts: ExportOptions) -> dict[str, DimRange]:
    """The dims of the graph ``opts`` asks for: batch and seq, and with ``--with-past`` past and total."""
    if opts.with_past:
        from attnres_export.exporter.with_past import with_past_ranges

        return with_past_ranges(opts.batch, opts.seq, opts.past, cfg.max_seq_len)
    if opts.past is not None:
        raise ExportError("--past needs --with-past")
    seq = opts.seq or DimRange(1, min(64, cfg.max_seq_len), cfg.max_seq_len)
    if seq.max > cfg.max_seq_len:
        raise ExportError(f"--seq max {seq.max} exceeds the model's max_seq_len {cfg.max_seq_len}; lower it")
    return {"batch": opts.batch, "seq": seq}


def _with_past_job(traced: torch.nn.Module, weights: _Weights, cfg: Any, model_id: str, opts: ExportOptions) -> _Job:
    from attnres_export.exporter.with_past import dynamic_dims_with_past, export_with_past
    from attnres_export.models.base import step_input_axes

    wrapper = traced.with_past()
    if wrapper is None:
        raise ExportError(f"--with-past: {cfg.arch} models have no KV cache (encoders and models without decode "
                          "state); drop --with-past")
    ranges = _ranges(cfg, opts)
    cache = wrapper.cache_inputs()
    metadata = {"arch": cfg.arch, "with_past": True, "inputs": step_input_axes(cache),
                "cache": [{"name": c.name, "present": c.present, "axes": list(c.axes), "dtype": c.dtype}
                          for c in cache],
                "vocab_size": cfg.vocab_size, "max_seq_len": cfg.max_seq_len, "config": cfg.to_dict(),
                "model_id": model_id, **wrapper.metadata()}
    dynamic = dynamic_dims_with_past(step_input_axes(cache), ranges)
    return _Job(ranges, lambda status: export_with_past(traced, ranges, opts.dtype, opts.opset, opts.seed,
                                                        opts.fuse_norm, opts.trace_whole, status, weights.read,
                                                        weights.stored, cache_folder(opts.trace_cache))[0], dynamic,
                metadata, traced.fused_node_count(), _check_shapes(ranges, True),
                {"with_past": True, "shapes": "batch x seq x past"})


def _check_shapes(ranges: dict[str, DimRange], with_past: bool) -> list[tuple[int, ...]]:
    """The shapes the export's check runs: those ``attnres check`` picks for the ranges written into the file."""
    return default_shapes({name: rng.as_list() for name, rng in ranges.items()}, with_past)


def _stamp_and_convert(onnx_model: onnx.ModelProto, expected: int, opts: ExportOptions,
                       ranges: dict[str, DimRange], extra_meta: dict, data_dir: Path
                       ) -> tuple[onnx.ModelProto, int, dict[str, int]]:
    """Check the export fused every aggregation the model has, stamp the export metadata, and convert the
    fused nodes to the target's form (``data_dir``: the staging folder, whose data file the conversion may
    change): ``(model, fused, fused_by_type)``."""
    fused_nodes = attnres_nodes(onnx_model.graph)
    fused, fused_by_type = len(fused_nodes), dict(Counter(n.op_type for n in fused_nodes))
    if fused != expected:
        raise ExportError(f"expected {expected} attnres nodes, the export has {fused} ({fused_by_type}); "
                          "please report this")
    meta = {"attnres_version": __version__, "op_set_version": OPSET_VERSION, "dtype": opts.dtype,
            "target": opts.target, "dims": {k: v.as_list() for k, v in ranges.items()},
            "source_file": opts.source.name, **extra_meta}
    set_metadata(onnx_model, EXPORT_KEY, json.dumps(meta))
    if fused or opts.target == "onnxruntime":
        onnx_model = convert(onnx_model, opts.target, data_dir)
    return onnx_model, fused, fused_by_type


def check_export(checkpoint: Checkpoint, path: Path, opts: ExportOptions,
                 status: Callable[[str], None] = lambda _: None) -> Report:
    """The parity check ``attnres-export`` runs on its staged file, run on the ONNX file at ``path`` against the
    open ``checkpoint``."""
    shapes = _check_shapes(_ranges(checkpoint.config, opts), opts.with_past)
    blocks = export_info(load_onnx(path, load_external_data=False)).get(INT8_ACTIVATIONS_KEY)
    return check_onnx(path, path.name, reference_with(lambda: checkpoint.model(None), blocks), opts.with_past,
                      opts.dtype, opts.seed, shapes, tolerance_for(opts.dtype, opts.tolerances), status)


def _export(model: torch.nn.Module, weights: _Weights, ranges: dict[str, DimRange],
            dynamic: dict[str, dict[int, tuple[str, DimRange]]], opts: ExportOptions,
            status: Callable[[str], None]) -> ir.Model:
    """The ONNX model of ``model`` in the export dtype (the model itself when its weights are stored in it: no
    copy): assembled from its export plan, or traced whole when its family has none or ``opts.trace_whole``."""
    export_model = model_as(model, opts.dtype)
    trace_sizes = {name: _trace_size(rng) for name, rng in ranges.items()}
    plan = None if opts.trace_whole else plan_of(export_model, with_past=False, fuse_norm=opts.fuse_norm)
    if plan is not None:
        return export_planned(export_model, plan, ranges, trace_sizes, opts.dtype, opts.opset, status, weights.read,
                              weights.stored, cache_folder(opts.trace_cache))
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
