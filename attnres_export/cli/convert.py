"""``attnres convert``: rewrite an exported ONNX for another target."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.atomic import check_outputs
from attnres_export.cli.framework import app, command, console, err_console
from attnres_export.cli.options import Target, file_size, require_files
from attnres_export.exporter.options import onnx_files

ORT_TRT_NOTE = (
    "for ONNX Runtime's TensorRT execution provider from ONNX Runtime 1.22 (earlier versions list no IPluginV3 "
    "creators), with trt_extra_plugin_lib_paths naming libattnres_trt.so; read in ONNX Runtime's and onnx-tensorrt's "
    "sources, not yet run on a GPU (docs/tensorrt.md)"
)


@command(app)
def convert(
    source: Annotated[Path, typer.Argument(help="ONNX file written by attnres-export (or attnres convert).")],
    target: Target,
    output: Annotated[Path, typer.Option("-o", "--output", help="ONNX file to write.")],
) -> None:
    """Rewrite an exported ONNX for another target (fused nodes <-> standard-op decomposition)."""
    require_files([("SOURCE", source)])
    check_outputs(onnx_files("-o", output), {"SOURCE": source})
    from attnres_export.graphs.load import load_onnx
    from attnres_export.graphs.save import save_onnx_atomic
    from attnres_export.graphs.targets import convert as convert_model

    files = save_onnx_atomic(convert_model(load_onnx(source), target), output)
    console.print(f"wrote [bold]{output}[/bold] ({file_size(files)}) for target {target}")
    if target == "ort-trt":
        err_console.print(f"note: {ORT_TRT_NOTE}", highlight=False, soft_wrap=True)
