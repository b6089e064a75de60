"""``attnres convert``: rewrite an exported ONNX for another target."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.atomic import check_outputs
from attnres_export.cli.framework import app, command, console, err_console
from attnres_export.cli.options import Target, file_size, require_files

ORT_TRT_UNSUPPORTED = (
    "ONNX Runtime's TensorRT execution provider lists only IPluginV2 creators (getPluginCreatorList) and the "
    "attnres plugins are IPluginV3, so it does not run this file yet (no ONNX Runtime version is known to); "
    "run TensorRT through `attnres build` (docs/tensorrt.md)"
)


@command(app)
def convert(
    source: Annotated[Path, typer.Argument(help="ONNX file written by attnres-export (or attnres convert).")],
    target: Target,
    output: Annotated[Path, typer.Option("-o", "--output", help="ONNX file to write.")],
) -> None:
    """Rewrite an exported ONNX for another target (fused nodes <-> standard-op decomposition)."""
    require_files([("SOURCE", source)])
    check_outputs({"-o": output}, {"SOURCE": source})
    from attnres_export.graphs.load import load_onnx
    from attnres_export.graphs.save import save_onnx_atomic
    from attnres_export.graphs.targets import convert as convert_model

    files = save_onnx_atomic(convert_model(load_onnx(source), target), output)
    console.print(f"wrote [bold]{output}[/bold] ({file_size(files)}) for target {target}")
    if target == "ort-trt":
        err_console.print(f"[yellow]warning:[/yellow] {ORT_TRT_UNSUPPORTED}")
