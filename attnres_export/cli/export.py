"""``attnres export`` / ``attnres-export``: checkpoint -> ONNX, then the parity check.

Every option is parsed and every input path checked before torch or onnx is imported, so a mistake is one line
within a fraction of a second (the imports take seconds)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.atomic import check_outputs
from attnres_export.cli.framework import (
    VersionOption,
    app,
    command,
    console,
    err_console,
    export_app,
    fail,
    usage_error,
)
from attnres_export.cli.options import (
    Dtype,
    ExampleShape,
    ExportTarget,
    ReportPath,
    Seed,
    Strict,
    Tol,
    Vocab,
    file_size,
    parse_example_shapes,
    parse_tolerances,
    range_option,
    require_files,
)
from attnres_export.cli.progress import progress
from attnres_export.dims import DimRange
from attnres_export.exporter.export import model_kind
from attnres_export.exporter.options import (
    DEFAULT_OPSET,
    SUPPORTED_OPSETS,
    ExportOptions,
    export_outputs,
    refuse_default_output_of_another_source,
    validate_options,
)
from attnres_export.models.folder_files import require_config


@command(app, export_app, name="export")
def export(
    model: Annotated[Path, typer.Argument(
        help="attnres checkpoint (.pt or folder), torch.export program (.pt2), ONNX file, or pickled module "
             "(--trust-pickle).")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="ONNX file to write.")] = None,
    target: ExportTarget = "tensorrt",
    dtype: Dtype = "float32",
    opset: Annotated[int, typer.Option(min=SUPPORTED_OPSETS.start, max=SUPPORTED_OPSETS.stop - 1,
                                       help="Default-domain ONNX opset.")] = DEFAULT_OPSET,
    batch: Annotated[DimRange, range_option("Batch range.")] = "1:1:8",
    seq: Annotated[DimRange | None, range_option("Sequence range [1:64:max_seq_len].")] = None,
    report: ReportPath = None,
    check: Annotated[bool, typer.Option("--check/--no-check", help="Run the ONNX Runtime parity check.")] = True,
    seed: Seed = 0,
    tol: Tol = None,
    example_shape: ExampleShape = None,
    trust_pickle: Annotated[bool, typer.Option(
        "--trust-pickle", help="Unpickle a whole nn.Module (runs code from the file; only for files you trust).")] =
    False,
    imports: Annotated[list[str] | None, typer.Option(
        "--import", metavar="MODULE", help="Module to import before unpickling, for the model's classes "
                                           "(repeatable; the current folder is searched too).")] = None,
    vocab: Vocab = None,
    strict: Strict = False,
    with_past: Annotated[bool, typer.Option(
        "--with-past", help="Decoder checkpoints and folders: export the one-step graph with its cache "
                            "(past_key_values in, presents out; docs/decode.md)."
    )] = False,
    past: Annotated[DimRange | None, range_option(
        "With --with-past: past length range, MIN may be 0 [0:63:max_seq_len-1].", low=0)] = None,
    fuse_norm: Annotated[bool, typer.Option(
        "--fuse-norm", help="Models with depth aggregations: one AttnResAggregateNorm node per aggregation "
                            "and the RMSNorm after it (its TensorRT kernel is not yet verified on a GPU).")] = False,
    genai: Annotated[Path | None, typer.Option(
        "--genai", help="With --with-past --target onnxruntime: write a complete onnxruntime-genai folder here "
                        "(model.onnx, genai_config.json, tokenizer files; docs/genai.md).")] = None,
    hf_onnx: Annotated[Path | None, typer.Option(
        "--hf-onnx", help="With --with-past --target portable, from a Hugging Face folder: write a folder "
                          "transformers.js loads here (config.json, generation_config.json, tokenizer files, "
                          "onnx/model.onnx; docs/transformersjs.md).")] = None,
    version: VersionOption = False,
    quantize: Annotated[str | None, typer.Option(
        "--quantize", metavar="int4|int8", help="Checkpoints: quantize the float linear and expert weights on export "
        "(weight-only, round to nearest per block; docs/quantization.md).")] = None,
    quantize_block_size: Annotated[int, typer.Option(
        "--quantize-block-size", help="With --quantize: input columns per scale (16, 32, 64, 128 or 256).")] = 32,
    quantize_embeddings: Annotated[bool, typer.Option(
        "--quantize-embeddings", help="With --quantize: the embedding table and the output head too.")] = False,
    int8_activations: Annotated[bool, typer.Option(
        "--int8-activations", help="Quantized weights, --target onnxruntime or --genai, float32: each MatMulNBits "
        "quantizes its activations to int8 per block at run time (faster on CPU, onnxruntime-genai's default; the "
        "check's reference does the same; docs/quantization.md#int8-activations).")] = False,
    trace_whole: Annotated[bool, typer.Option(
        "--trace-whole", help="Trace the whole model instead of tracing each kind of layer once and assembling the "
                              "graph (the same model; slower, growing with depth; docs/exporter-notes.md).")] = False,
    no_trace_cache: Annotated[bool, typer.Option(
        "--no-trace-cache", help="Trace the layers even when the trace cache holds their trace, and store nothing "
                                 "there (the cache: $ATTNRES_TRACE_CACHE or ~/.cache/attnres/traces; "
                                 "docs/exporter-notes.md#the-trace-cache).")] = False,
) -> None:
    """Export MODEL to ONNX with one fused node per depth aggregation, then check parity on ONNX Runtime."""
    if report is not None and not check:
        raise usage_error("--report", "--report needs the parity check; drop --no-check or --report")
    require_files([("MODEL", model)])
    opts = ExportOptions(
        source=model, output=output, target=target, dtype=dtype, opset=opset, batch=batch, seq=seq, check=check,
        seed=seed, tolerances=parse_tolerances(tol), with_past=with_past, past=past, fuse_norm=fuse_norm,
        trace_whole=trace_whole, trace_cache=not no_trace_cache, quantize=quantize,
        quantize_block_size=quantize_block_size, quantize_embeddings=quantize_embeddings,
        int8_activations=int8_activations,
    )
    if genai is not None and hf_onnx is not None:
        raise usage_error("--hf-onnx", "--genai and --hf-onnx: one folder per export; run the export once for each")
    if hf_onnx is not None:
        from attnres_export.exporter.hf_onnx_options import hf_onnx_options

        opts = hf_onnx_options(opts, hf_onnx, {"--report": report})
    elif genai is None:
        check_outputs({**export_outputs(opts.resolved_output()), "--report": report}, {"MODEL": model})
        if model_kind(model) == "checkpoint":  # what export_checkpoint refuses before it opens the model, in order
            validate_options(opts)
            refuse_default_output_of_another_source(opts)
            require_config(model)
    else:
        from attnres_export.exporter.genai_options import genai_options

        opts = genai_options(opts, genai, {"--report": report})

    from attnres_export.cli.render import (
        fusion_table,
        fusion_warnings,
        quantization_table,
        quantized_line,
        report_table,
    )
    from attnres_export.exporter.export import export_any
    from attnres_export.exporter.foreign import ForeignExportResult, ForeignOptions

    foreign = ForeignOptions(parse_example_shapes(example_shape), trust_pickle, strict, imports or [], vocab)
    with progress("exporting") as status:
        if hf_onnx is not None:
            from attnres_export.exporter.hf_onnx import export_hf_onnx

            result = export_hf_onnx(opts, hf_onnx, foreign, status=status)
        elif genai is None:
            result = export_any(opts, foreign, status=status)
        else:
            from attnres_export.exporter.genai import export_genai

            result = export_genai(opts, genai, foreign, status=status)
    if isinstance(result, ForeignExportResult) and result.fusion is not None:
        console.print(fusion_table(result.fusion))
        for warning in fusion_warnings(result.fusion):
            err_console.print(warning)
    console.print(f"wrote [bold]{result.path}[/bold] ({file_size(result.files)}): target {target}, {dtype}, "
                  f"{', '.join(f'{n} {t}' for t, n in result.fused_by_type.items()) or 'no attnres'} nodes "
                  f"{_node_form(target)}")
    _print_onnxruntime_ops(result.onnxruntime_ops)
    quantized = getattr(result, "quantized", None)
    if quantized is not None and quantized.formats:
        console.print(quantized_line(quantized.formats, quantized.stored_bytes, quantized.parameters))
        for problem, count in quantized.tensorrt_problems.items():
            err_console.print(f"warning: target tensorrt: TensorRT does not build {count} of these weights "
                              f"({problem}); the file runs on ONNX Runtime (docs/quantization.md#tensorrt)")
    if target == "tensorrt":
        _warn_pluginless(result.fused_by_type)
    if result.report is None:
        return
    reference = result.report.extra.get("reference", "the float32 PyTorch reference")
    console.print(report_table(result.report, f"Parity against {reference}"))
    if result.report.extra.get("quantization"):
        console.print(quantization_table(result.report.extra["quantization"]))
    if report is not None:
        result.report.write_json(report)
        console.print(f"report: {report}")
    if not result.report.ok:
        fail(f"parity check failed: an output missed its bar (see the table); the model was kept as {result.path} "
             f"for inspection, and {opts.resolved_output()} was not written")


def _node_form(target: str) -> str:
    return {"tensorrt": "fused", "onnxruntime": "written as ONNX Runtime's ops or standard ops"}.get(
        target, "decomposed into standard ops")


def _print_onnxruntime_ops(ops) -> None:
    """The ``onnxruntime`` target's fused ops, and one note per kind of computation it left in standard ops."""
    if ops is None:
        return
    written = ", ".join(f"{count} {op}" for op, count in ops.nodes.items()) or "none matched"
    console.print(f"ONNX Runtime fused ops: {written}")
    for line in ops.kept:
        err_console.print(f"note: target onnxruntime: {line}", highlight=False, soft_wrap=True)


def _warn_pluginless(fused_by_type: dict[str, int]) -> None:
    """One line when the file holds attnres nodes no TensorRT plugin runs yet (K3's KimiDeltaAttention): ONNX
    Runtime runs them through the reference ops, ``attnres build`` refuses them."""
    from attnres_export.ops.descriptors import OPS

    pluginless = [f"{count} {op}" for op, count in fused_by_type.items() if not OPS[op].has_plugin]
    if pluginless:
        err_console.print(f"[yellow]warning:[/yellow] {', '.join(pluginless)} nodes have no TensorRT plugin yet, so "
                          "no TensorRT engine can be built from this file (ONNX Runtime runs them through the "
                          "reference ops); --target portable writes them as standard ONNX ops")
