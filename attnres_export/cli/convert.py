"""``attnres convert``: rewrite an exported ONNX for another target."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli._app import app, console, file_size, friendly_errors


@app.command()
def convert(
    source: Annotated[Path, typer.Argument(help="ONNX file written by attnres-export (or attnres convert).")],
    target: Annotated[str, typer.Option(help="portable, tensorrt or ort-trt.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="ONNX file to write.")],
) -> None:
    """Rewrite an exported ONNX for another target (fused nodes <-> standard-op decomposition)."""
    _convert(source, target, output)


@friendly_errors
def _convert(source: Path, target: str, output: Path) -> None:
    from attnres_export.exporter.save import save_onnx_atomic
    from attnres_export.graphs.inspect import load_onnx
    from attnres_export.graphs.schemas import register_schemas
    from attnres_export.graphs.targets import convert as convert_model

    register_schemas()
    converted = convert_model(load_onnx(source), target)
    files = save_onnx_atomic(converted, output)
    console.print(f"wrote [bold]{output}[/bold] ({file_size(files)}) for target {target}")


