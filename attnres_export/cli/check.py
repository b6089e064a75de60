"""``attnres check``: every given artifact against the PyTorch model on the same inputs.

The check itself is ``parity/check.py: check_artifacts`` (``api.check`` runs it too; the exporter's own check runs
the same steps, ``parity/session.py``); this command parses, checks the paths, and renders."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.atomic import check_outputs
from attnres_export.cli.framework import app, command, console, fail
from attnres_export.cli.options import (
    AllowEngineHostCode,
    CheckShapes,
    EngineDtype,
    OrtProvider,
    Plugin,
    ReportPath,
    Seed,
    Tol,
    parse_tolerances,
    require_files,
)
from attnres_export.cli.progress import progress
from attnres_export.errors import AttnresError


@command(app)
def check(
    model: Annotated[Path, typer.Argument(help="attnres checkpoint (.pt or folder) the artifacts were exported from.")],
    onnx: Annotated[list[Path] | None, typer.Option(
        "--onnx", help="ONNX file to run on ONNX Runtime, plain or with-past (repeatable).")] = None,
    engine: Annotated[list[Path] | None, typer.Option(
        "--engine", help="TensorRT engine (from attnres build; from trtexec or Polygraphy with --plugin).")] = None,
    plugin: Plugin = None,
    engine_dtype: EngineDtype = None,
    allow_engine_host_code: AllowEngineHostCode = False,
    ort_provider: OrtProvider = "cpu",
    shapes: CheckShapes = None,
    seed: Seed = 0,
    report: ReportPath = None,
    save_polygraphy: Annotated[Path | None, typer.Option(
        help="Write each artifact's inputs, reference outputs and replay script for Polygraphy into this folder.")]
    = None,
    tol: Tol = None,
) -> None:
    """Run each --onnx/--engine and the PyTorch model on the same inputs; exit 1 if a bar is missed."""
    if not onnx and not engine:
        raise AttnresError("nothing to check: pass at least one --onnx FILE or --engine FILE")
    artifacts = {f"artifact {i}": path for i, path in enumerate([*(onnx or []), *(engine or [])])}
    require_files([("MODEL", model), ("--plugin", plugin), *(("--onnx", p) for p in onnx or []),
                   *(("--engine", p) for p in engine or [])])
    replays = {f"--save-polygraphy for {path}": save_polygraphy / path.name for path in artifacts.values()
               } if save_polygraphy is not None else {}
    check_outputs({"--report": report}, {"MODEL": model, "--plugin": plugin, **artifacts}, replays)

    from attnres_export.cli.render import replay_lines, report_table
    from attnres_export.parity.check import check_artifacts

    with progress("checking") as status:
        result = check_artifacts(model, onnx or [], engine or [], shapes=[tuple(s) for s in shapes or []], seed=seed,
                                 tolerances=parse_tolerances(tol), ort_provider=ort_provider, plugin=plugin,
                                 allow_engine_host_code=allow_engine_host_code, engine_dtype=engine_dtype,
                                 status=status)
    console.print(report_table(result.report))
    if save_polygraphy is not None:
        from attnres_export.parity.polygraphy_io import save_replays

        for line in replay_lines(save_replays(save_polygraphy, result)):
            console.print(line, highlight=False, soft_wrap=True, markup=False)
    if report is not None:
        result.report.write_json(report)
        console.print(f"report: {report}")
    if not result.report.ok:
        fail("parity check failed: an output missed its bar (see the table)")
