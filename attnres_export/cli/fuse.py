"""``attnres fuse``: find the depth aggregations of an ONNX model written elsewhere and fuse each into one node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from attnres_export.atomic import check_outputs
from attnres_export.cli.framework import app, command, console, err_console, fail
from attnres_export.cli.options import ExampleShape, ReportPath, Seed, Strict, Vocab, file_size, parse_example_shapes
from attnres_export.cli.progress import progress


@command(app)
def fuse(
    model: Annotated[Path, typer.Argument(help="ONNX model with decomposed AttnRes aggregations.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Fused ONNX file to write.")],
    report: ReportPath = None,
    example_shape: ExampleShape = None,
    vocab: Vocab = None,
    seed: Seed = 0,
    strict: Strict = False,
) -> None:
    """Replace every verified depth aggregation of MODEL by one AttnResAggregate node and every verified attention
    layer with residual scores (RealFormer) by one ResidualScoreAttention node, then check parity."""
    from attnres_export.atomic import write_text_atomic
    from attnres_export.cli.render import fusion_table, fusion_warnings, report_table
    from attnres_export.exporter.foreign import refuse_unfused
    from attnres_export.exporter.options import export_outputs, publish
    from attnres_export.graphs.fusion import random_feeds
    from attnres_export.graphs.load import load_onnx
    from attnres_export.parity.fusion_checks import fuse_and_check

    check_outputs({**export_outputs(output), "--report": report}, {"MODEL": model})
    original = load_onnx(model)
    shapes = {name: dims for name, (dims, _) in parse_example_shapes(example_shape).items()}
    with progress("finding and verifying aggregations"):
        fusion, parity = fuse_and_check(original, random_feeds(original, seed, shapes, vocab), seed=seed)
    console.print(fusion_table(fusion))
    for warning in fusion_warnings(fusion):
        err_console.print(warning)
    refuse_unfused(fusion, strict)
    console.print(report_table(parity, "Whole-model parity: fused against the original (ONNX Runtime CPU)"))
    written, files = publish(fusion.model, output, parity, lambda _: None)
    if report is not None:
        data = {**fusion.to_dict(), "parity": parity.to_dict(), "onnx": str(written)}
        write_text_atomic(report, json.dumps(data, indent=2) + "\n")
        console.print(f"report: {report}")
    if not parity.ok:
        fail(f"the fused model does not match the original (see the table); it was kept as {written} for "
             f"inspection, and {output} was not written")
    nodes = ", ".join(f"{count} {op} nodes" for op, count in fusion.fused_by_op.items()) or "no attnres nodes"
    console.print(f"wrote [bold]{output}[/bold] ({file_size(files)}): {nodes}")
