"""``attnres fuse``: find the depth aggregations of an ONNX model written elsewhere and fuse each into one node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli.app import app, command, console, fail
from attnres_export.cli.options import ExampleShape, ReportPath, Seed, Vocab, file_size, parse_example_shapes


@command(app)
def fuse(
    model: Annotated[Path, typer.Argument(help="ONNX model with decomposed AttnRes aggregations.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Fused ONNX file to write.")],
    report: ReportPath = None,
    example_shape: ExampleShape = None,
    vocab: Vocab = None,
    seed: Seed = 0,
) -> None:
    """Replace every verified depth aggregation of MODEL by one AttnResAggregate node, then check parity."""
    from attnres_export.atomic import write_text_atomic
    from attnres_export.cli.render import fusion_table, report_table
    from attnres_export.exporter.save import save_onnx_atomic
    from attnres_export.graphs.fusion import random_feeds
    from attnres_export.graphs.load import load_onnx
    from attnres_export.parity.fusion_checks import fuse_and_check

    original = load_onnx(model)
    shapes = {name: dims for name, (dims, _) in parse_example_shapes(example_shape).items()}
    with console.status("finding and verifying aggregations"):
        fusion, parity = fuse_and_check(original, random_feeds(original, seed, shapes, vocab), seed=seed)
    console.print(fusion_table(fusion))
    console.print(report_table(parity, "Whole-model parity: fused against the original (ONNX Runtime CPU)"))
    if report is not None:
        write_text_atomic(report, json.dumps({**fusion.to_dict(), "parity": parity.to_dict()}, indent=2) + "\n")
        console.print(f"report: {report}")
    if not parity.ok:
        fail("the fused model does not match the original (see the table); nothing was written")
    files = save_onnx_atomic(fusion.model, output)
    console.print(f"wrote [bold]{output}[/bold] ({file_size(files)}): {fusion.fused} AttnResAggregate nodes")
