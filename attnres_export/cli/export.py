"""``attnres export`` / ``attnres-export``: checkpoint -> ONNX, then the parity check."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli._app import DebugOption, app, console, err_console, export_app, file_size, friendly_errors, set_debug
from attnres_export.errors import AttnresError


def export(
    model: Annotated[Path, typer.Argument(
        help="attnres checkpoint (.pt), torch.export program (.pt2), ONNX file, or pickled module (--trust-pickle).")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="ONNX file to write.")] = None,
    target: Annotated[str, typer.Option(help="tensorrt (fused attnres nodes) or portable (standard ops).")] =
    "tensorrt",
    dtype: Annotated[str, typer.Option(help="float32, float16 or bfloat16 weights and activations.")] = "float32",
    opset: Annotated[int, typer.Option(help="Default-domain ONNX opset (18..23).")] = 18,
    batch: Annotated[str, typer.Option(help="Batch range MIN:OPT:MAX.")] = "1:1:8",
    seq: Annotated[str | None, typer.Option(help="Sequence range MIN:OPT:MAX [1:64:max_seq_len].")] = None,
    report: Annotated[Path | None, typer.Option(help="Write the parity report as JSON here.")] = None,
    check: Annotated[bool, typer.Option("--check/--no-check", help="Run the ONNX Runtime parity check.")] = True,
    seed: Annotated[int, typer.Option(help="Seed of the check's random inputs.")] = 0,
    tol: Annotated[list[str] | None, typer.Option(help="Override a pass bar: DTYPE:rel_l2:cosine.")] = None,
    example_shape: Annotated[list[str] | None, typer.Option(
        "--example-shape", help="Foreign models: an input's shape NAME:d0,d1,...[:DTYPE] (repeatable).")] = None,
    trust_pickle: Annotated[bool, typer.Option(
        "--trust-pickle", help="Unpickle a whole nn.Module (runs code from the file; only for files you trust).")] =
    False,
    imports: Annotated[list[str] | None, typer.Option(
        "--import", help="Module to import before unpickling, for the model's classes (repeatable).")] = None,
    vocab: Annotated[int | None, typer.Option(help="Foreign models: integer inputs are drawn from [0, VOCAB).")] =
    None,
    debug: DebugOption = False,
) -> None:
    """Export MODEL to ONNX with one fused node per depth aggregation, then check parity on ONNX Runtime."""
    if debug:
        set_debug(True)
    foreign = (example_shape or [], trust_pickle, imports or [], vocab)
    _export(model, output, target, dtype, opset, batch, seq, report, check, seed, tol or [], foreign)


@friendly_errors
def _export(model, output, target, dtype, opset, batch, seq, report, check, seed, tol, foreign) -> None:
    from attnres_export.exporter.export import ExportOptions
    from attnres_export.exporter.foreign import ForeignExportResult, ForeignOptions, export_any, parse_example_shape
    from attnres_export.exporter.ranges import DimRange
    from attnres_export.parity.metrics import parse_tolerance

    if report is not None and not check:
        raise AttnresError("--report needs the parity check; drop --no-check or --report")
    opts = ExportOptions(
        checkpoint=model, output=output, target=target, dtype=dtype, opset=opset,
        batch=DimRange.parse(batch, "batch"), seq=DimRange.parse(seq, "seq") if seq else None,
        check=check, seed=seed, tolerances=dict(parse_tolerance(t) for t in tol),
    )
    shapes, trust, imports, vocab = foreign
    foreign_opts = ForeignOptions(dict(map(parse_example_shape, shapes)), trust, imports, vocab)
    with console.status("exporting") as status:
        result = export_any(opts, foreign_opts, status=lambda text: status.update(text))
    if isinstance(result, ForeignExportResult) and result.fusion is not None:
        console.print(result.fusion.table())
    console.print(f"wrote [bold]{result.path}[/bold] ({file_size(result.files)}): target {target}, {dtype}, "
                  f"{', '.join(f'{n} {t}' for t, n in result.fused_by_type.items()) or 'no attnres'} nodes "
                  f"{'fused' if target == 'tensorrt' else 'decomposed into standard ops'}")
    if result.report is None:
        return
    result.report.print(console)
    if report is not None:
        result.report.write_json(report)
        console.print(f"report: {report}")
    if not result.report.ok:
        err_console.print("[red]error:[/red] parity check failed: an output missed its bar (see the table)")
        raise typer.Exit(1)


app.command("export")(export)
export_app.command()(export)
