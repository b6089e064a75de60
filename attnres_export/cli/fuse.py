"""``attnres fuse``: find the depth aggregations of an ONNX model written elsewhere and fuse each into one node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli._app import DebugOption, app, console, err_console, file_size, friendly_errors, set_debug


@app.command("fuse")
def fuse(
    model: Annotated[Path, typer.Argument(help="ONNX model with decomposed AttnRes aggregations.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Fused ONNX file to write.")],
    report: Annotated[Path | None, typer.Option(help="Write sites and parity as JSON here.")] = None,
    example_shape: Annotated[list[str] | None, typer.Option(
        "--example-shape", help="Shape of an input for the check runs: NAME:d0,d1,... (repeatable).")] = None,
    vocab: Annotated[int | None, typer.Option(
        help="Integer inputs are drawn from [0, VOCAB) (default: the size of the table they index, else 2).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random inputs.")] = 0,
    debug: DebugOption = False,
) -> None:
    """Replace every verified depth aggregation of MODEL by one AttnResAggregate node, then check parity."""
    if debug:
        set_debug(True)
    _fuse(model, output, report, example_shape or [], vocab, seed)


@friendly_errors
def _fuse(model: Path, output: Path, report: Path | None, example_shape: list[str], vocab: int | None,
          seed: int) -> None:
    import onnx

    from attnres_export.errors import GraphError
    from attnres_export.exporter.foreign import parse_example_shape
    from attnres_export.exporter.save import save_onnx_atomic
    from attnres_export.graphs.fusion import fuse_model, random_feeds
    from attnres_export.io import write_text_atomic

    if not model.is_file():
        raise GraphError(f"{model}: no such file")
    try:
        original = onnx.load(str(model))
    except Exception as exc:
        raise GraphError(f"{model}: not a readable ONNX file ({type(exc).__name__})") from exc
    shapes = {name: dims for name, (dims, _) in map(parse_example_shape, example_shape)}
    with console.status("finding and verifying aggregations"):
        result = fuse_model(original, random_feeds(original, seed, shapes, vocab), seed=seed)
    console.print(result.table())
    if result.parity is not None:
        console.print(result.parity.table("Whole-model parity: fused against the original (ONNX Runtime CPU)"))
    if report is not None:
        write_text_atomic(report, json.dumps(result.to_dict(), indent=2) + "\n")
        console.print(f"report: {report}")
    if not result.ok:
        err_console.print("[red]error:[/red] the fused model does not match the original (see the table); "
                          "nothing was written")
        raise typer.Exit(1)
    files = save_onnx_atomic(result.model, output)
    console.print(f"wrote [bold]{output}[/bold] ({file_size(files)}): {result.fused} AttnResAggregate nodes")
