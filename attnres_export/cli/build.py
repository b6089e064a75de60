"""``attnres build``: ONNX -> TensorRT engine with our plugin, plus the ENGINE.json manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.atomic import check_outputs
from attnres_export.backends.tensorrt.manifest import manifest_path
from attnres_export.cli.framework import app, command, console, err_console
from attnres_export.cli.options import Plugin, parse_range
from attnres_export.cli.progress import progress


@command(app)
def build(
    onnx: Annotated[Path, typer.Argument(help="ONNX written by attnres-export --target tensorrt.")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Engine file [ONNX with .engine].")] = None,
    plugin: Plugin = None,
    batch: Annotated[str | None, typer.Option(help="Batch range MIN:OPT:MAX [the exported range].")] = None,
    seq: Annotated[str | None, typer.Option(help="Sequence range MIN:OPT:MAX [the exported range].")] = None,
    past: Annotated[str | None, typer.Option(
        help="With-past ONNX: past length range MIN:OPT:MAX, MIN may be 0; the mask's past + seq follows "
             "[the exported range].")] = None,
    timing_cache: Annotated[Path | None, typer.Option(help="Timing cache to read and update.")] = None,
    opt_level: Annotated[int | None, typer.Option(help="Builder optimization level 0..5.")] = None,
    embed_plugin: Annotated[bool, typer.Option(
        help="Serialize libattnres_trt_dyn.so into a version-compatible engine (checked in a fresh process).")] = False,
    workspace: Annotated[int | None, typer.Option(help="Workspace limit in MB.")] = None,
) -> None:
    """Build a TensorRT engine (strongly typed: the ONNX's dtype is the engine's) after a plugin preflight."""
    from attnres_export.backends.tensorrt.builder import BuildOptions, PreflightFailed, build_engine

    opts = BuildOptions(
        onnx=onnx, output=output, plugin=plugin, batch=parse_range(batch, "batch"), seq=parse_range(seq, "seq"),
        past=parse_range(past, "past", low=0), timing_cache=timing_cache, opt_level=opt_level,
        embed_plugin=embed_plugin, workspace_mb=workspace,
    )
    engine = opts.resolved_output()
    check_outputs({"-o": engine, "--timing-cache": timing_cache, "manifest": manifest_path(engine)},
                  {"ONNX": onnx, "--plugin": plugin})
    try:
        with progress("building") as status:
            result = build_engine(opts, status=status)
    except PreflightFailed as failed:
        for line in failed.result.lines():
            err_console.print(line)
        raise
    for line in result.notes:
        err_console.print(line)
    m = result.manifest
    console.print(f"wrote [bold]{result.engine}[/bold] and {result.manifest_path}: TensorRT {m.tensorrt_version}, "
                  f"{m.dtype}, GPU {m.gpu}, plugin {'embedded' if m.plugin_embedded else m.plugin_library}")
    console.print(f"as plugin: {', '.join(m.plugin_nodes) or 'none'}", highlight=False, soft_wrap=True)
    if m.inlined_nodes:
        err_console.print(f"[yellow]warning:[/yellow] not running as the plugin: {', '.join(m.inlined_nodes)}")
    if m.unknown_nodes:
        err_console.print("[yellow]warning:[/yellow] the engine inspector cannot tell whether these run as the plugin "
                          f"(inside a Myelin ForeignNode layer): {', '.join(m.unknown_nodes)}")
