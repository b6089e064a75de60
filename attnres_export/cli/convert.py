"""``attnres convert``: rewrite an exported ONNX for another target."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli.app import app, command, console
from attnres_export.cli.options import file_size


@command(app)
def convert(
    source: Annotated[Path, typer.Argument(help="ONNX file written by attnres-export (or attnres convert).")],
    target: Annotated[str, typer.Option(help="portable, tensorrt or ort-trt.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="ONNX file to write.")],
) -> None:
    """Rewrite an exported ONNX for another target (fused nodes <-> standard-op decomposition)."""
    from attnres_export.exporter.save import save_onnx_atomic
    from attnres_export.graphs.load import load_onnx
    from attnres_export.graphs.targets import convert as convert_model

    files = save_onnx_atomic(convert_model(load_onnx(source), target), output)
    console.print(f"wrote [bold]{output}[/bold] ({file_size(files)}) for target {target}")
