"""``attnres check``: every given artifact against the float32 PyTorch reference on the same inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli._app import DebugOption, app, console, err_console, friendly_errors, set_debug
from attnres_export.errors import AttnresError


@app.command()
def check(
    model: Annotated[Path, typer.Argument(help="attnres checkpoint (.pt): the float32 reference.")],
    onnx: Annotated[list[Path] | None, typer.Option("--onnx", help="ONNX file to run on ONNX Runtime.")] = None,
    engine: Annotated[list[Path] | None, typer.Option("--engine", help="TensorRT engine (from attnres build).")] =
    None,
    plugin: Annotated[Path | None, typer.Option(help="Plugin library for engines [from their manifest].")] = None,
    ort_provider: Annotated[str, typer.Option(help="ONNX Runtime provider for --onnx: cpu or cuda.")] = "cpu",
    shapes: Annotated[list[str] | None, typer.Option(help="B,T shape to check [ONNX metadata: opt, max B x min T].")]
    = None,
    seed: Annotated[int, typer.Option(help="Seed of the random inputs.")] = 0,
    report: Annotated[Path | None, typer.Option(help="Write the report as JSON here.")] = None,
    save_polygraphy: Annotated[Path | None, typer.Option(help="Write inputs.json/outputs.json for Polygraphy here.")]
    = None,
    tol: Annotated[list[str] | None, typer.Option(help="Override a pass bar: DTYPE:rel_l2:cosine.")] = None,
    debug: DebugOption = False,
) -> None:
    """Run each --onnx/--engine and the float32 PyTorch model on the same inputs; exit 1 if a bar is missed."""
    if debug:
        set_debug(True)
    _check(model, onnx or [], engine or [], plugin, ort_provider, shapes or [], seed, report, save_polygraphy,
           tol or [])


def parse_shape(text: str) -> tuple[int, int]:
    """``B,T`` -> (B, T)."""
    try:
        batch, seq = (int(p) for p in text.split(","))
    except ValueError:
        raise AttnresError(f"--shapes {text!r}: expected B,T with whole numbers, e.g. 2,64") from None
    if batch < 1 or seq < 1:
        raise AttnresError(f"--shapes {text!r}: B and T must be >= 1")
    return batch, seq


def default_shapes(dims: dict[str, list[int]]) -> list[tuple[int, int]]:
    """The opt shape and the largest batch with the fewest tokens, from recorded batch/seq ranges."""
    from attnres_export.exporter.export import check_shapes
    from attnres_export.exporter.ranges import DimRange

    if "batch" not in dims or "seq" not in dims:
        raise AttnresError("no batch/seq ranges recorded in the artifacts; pass --shapes B,T")
    return [tuple(s) for s in check_shapes({k: DimRange(*dims[k]) for k in ("batch", "seq")})]


@friendly_errors
def _check(model_path, onnx_paths, engine_paths, plugin, provider, shape_texts, seed, report_path, polygraphy_dir,
           tol) -> None:
    import numpy as np

    from attnres_export.engine.onnx_info import export_info
    from attnres_export.models import load_checkpoint
    from attnres_export.parity.artifacts import engine_runner, onnx_runner
    from attnres_export.parity.metrics import parse_tolerance, tolerance_for
    from attnres_export.parity.report import run_checks, run_reference
    from attnres_export.parity.runners import TorchRunner

    if not onnx_paths and not engine_paths:
        raise AttnresError("nothing to check: pass at least one --onnx FILE or --engine FILE")
    overrides = dict(parse_tolerance(t) for t in tol)
    model, _ = load_checkpoint(model_path)
    runners, recorded_dims = [], []
    for path in onnx_paths:
        runner, dtype, onnx_model = onnx_runner(path, provider)
        runners.append((runner, dtype, tolerance_for(dtype, overrides)))
        recorded_dims.append(export_info(onnx_model).get("dims", {}))
    for path in engine_paths:
        runner, dtype = engine_runner(path, plugin)
        runners.append((runner, dtype, tolerance_for(dtype, overrides)))
        recorded_dims.append(runner.manifest.dims)
    shapes = [parse_shape(s) for s in shape_texts] or default_shapes(next((d for d in recorded_dims if d), {}))

    def feeds(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        return model.random_inputs(shape[0], shape[1], np.random.default_rng([seed, *shape]))

    reference = TorchRunner(model, list(model.output_names))
    with console.status("running") as status:
        status.update("running the float32 PyTorch reference")
        expected = run_reference(reference, shapes, feeds)
        result = run_checks(reference, runners, shapes, feeds, progress=lambda what: status.update(what),
                            expected=expected)
    result.extra.update({"checkpoint": str(model_path), "seed": seed})
    result.print(console)
    if polygraphy_dir is not None:
        _save_polygraphy(polygraphy_dir, shapes, feeds, expected, reference.backend, onnx_paths)
    if report_path is not None:
        result.write_json(report_path)
        console.print(f"report: {report_path}")
    if not result.ok:
        err_console.print("[red]error:[/red] parity check failed: an output missed its bar (see the table)")
        raise typer.Exit(1)


def _save_polygraphy(directory, shapes, feeds, expected, runner_name, onnx_paths) -> None:
    from attnres_export.parity.polygraphy_io import save_polygraphy

    inputs, outputs = save_polygraphy(directory, [feeds(s) for s in shapes], [expected[s] for s in shapes],
                                      runner_name)
    target = onnx_paths[0] if onnx_paths else "MODEL.tensorrt.onnx"
    console.print(f"polygraphy files: {inputs}, {outputs}; reproduce with:\n"
                  f"  polygraphy run {target} --trt --strongly-typed --plugins libattnres_trt.so "
                  f"--load-inputs {inputs} --load-outputs {outputs} --compare-func cosine_similarity "
                  "--cosine-similarity-threshold 0.999 (add --trt-min/opt/max-shapes covering every shape)",
                  highlight=False, soft_wrap=True)
