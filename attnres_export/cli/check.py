"""``attnres check``: every given artifact against the float32 PyTorch reference on the same inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.atomic import check_outputs
from attnres_export.cli.framework import app, command, console, fail
from attnres_export.cli.options import (
    AllowEngineHostCode,
    Plugin,
    ReportPath,
    Seed,
    Shapes,
    Tol,
    parse_shapes,
    parse_tolerances,
)
from attnres_export.dtypes import STORAGE_TYPES
from attnres_export.errors import AttnresError


@command(app)
def check(
    model: Annotated[Path, typer.Argument(help="attnres checkpoint (.pt): the float32 reference.")],
    onnx: Annotated[list[Path] | None, typer.Option("--onnx", help="ONNX file to run on ONNX Runtime.")] = None,
    engine: Annotated[list[Path] | None, typer.Option(
        "--engine", help="TensorRT engine (from attnres build; from trtexec or Polygraphy with --plugin).")] = None,
    plugin: Plugin = None,
    engine_dtype: Annotated[str | None, typer.Option(
        help="Engines without a manifest: the dtype of the ONNX they were built from (picks the pass bar) "
             "[what their I/O tensors tell].")] = None,
    allow_engine_host_code: AllowEngineHostCode = False,
    ort_provider: Annotated[str, typer.Option(help="ONNX Runtime provider for --onnx: cpu or cuda.")] = "cpu",
    shapes: Shapes = None,
    seed: Seed = 0,
    report: ReportPath = None,
    save_polygraphy: Annotated[Path | None, typer.Option(help="Write inputs.json/outputs.json for Polygraphy here.")]
    = None,
    tol: Tol = None,
) -> None:
    """Run each --onnx/--engine and the float32 PyTorch model on the same inputs; exit 1 if a bar is missed."""
    import numpy as np

    from attnres_export.backends.factory import engine_runner, onnx_runner
    from attnres_export.backends.pytorch.runner import TorchRunner
    from attnres_export.cli.render import report_table
    from attnres_export.graphs.metadata import export_info
    from attnres_export.models import load_checkpoint
    from attnres_export.parity.metrics import tolerance_for
    from attnres_export.parity.report import run_checks, run_reference

    if not onnx and not engine:
        raise AttnresError("nothing to check: pass at least one --onnx FILE or --engine FILE")
    artifacts = {f"artifact {i}": path for i, path in enumerate([*(onnx or []), *(engine or [])])}
    check_outputs({"--report": report}, {"MODEL": model, "--plugin": plugin, **artifacts})
    overrides = parse_tolerances(tol)
    if engine_dtype is not None and engine_dtype not in STORAGE_TYPES:
        raise AttnresError(f"--engine-dtype {engine_dtype!r}: choose one of {', '.join(STORAGE_TYPES)}")
    wanted_shapes = parse_shapes(shapes)
    reference_model, config = load_checkpoint(model)
    runners, recorded_dims = [], []
    for path in onnx or []:
        runner, dtype, onnx_model = onnx_runner(path, ort_provider)
        runners.append((runner, dtype, tolerance_for(dtype, overrides)))
        recorded_dims.append(export_info(onnx_model).get("dims", {}))
    for path in engine or []:
        runner, dtype = engine_runner(path, plugin, allow_engine_host_code, engine_dtype)
        if dtype is None:
            raise AttnresError(f"{path.name} has no manifest, and its input and output types do not tell its dtype "
                               "(attnres exports write float32 logits in every dtype); pass --engine-dtype "
                               f"{'|'.join(STORAGE_TYPES)}, the dtype of the ONNX it was built from")
        runners.append((runner, dtype, tolerance_for(dtype, overrides)))
        recorded_dims.append(runner.manifest.dims if runner.manifest is not None else {})
    refuse_shapes_outside(wanted_shapes, recorded_dims, config.max_seq_len)
    run_shapes = wanted_shapes or default_shapes(next((d for d in recorded_dims if d), {}))

    def feeds(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        return reference_model.random_inputs(shape[0], shape[1], np.random.default_rng([seed, *shape]))

    reference = TorchRunner(reference_model, list(reference_model.output_names))
    with console.status("running") as status:
        status.update("running the float32 PyTorch reference")
        expected = run_reference(reference, run_shapes, feeds)
        result = run_checks(reference, runners, run_shapes, feeds, progress=lambda what: status.update(what),
                            expected=expected, precise=TorchRunner(reference_model, list(reference_model.output_names),
                                                                   dtype="float64"))
    result.extra.update({"checkpoint": str(model), "seed": seed})
    console.print(report_table(result))
    if save_polygraphy is not None:
        _save_polygraphy(save_polygraphy, run_shapes, feeds, expected, reference.backend, onnx or [])
    if report is not None:
        result.write_json(report)
        console.print(f"report: {report}")
    if not result.ok:
        fail("parity check failed: an output missed its bar (see the table)")


def refuse_shapes_outside(shapes: list[tuple[int, int]], recorded: list[dict[str, list[int]]],
                          max_seq_len: int) -> None:
    """A ``--shapes`` value outside a range an artifact was exported for, or longer than the model's
    max_seq_len, is refused in one line instead of failing inside a runtime."""
    for batch, seq in shapes:
        if seq > max_seq_len:
            raise AttnresError(f"--shapes {batch},{seq}: T is over the model's max_seq_len {max_seq_len}")
        for dims in recorded:
            for name, size in (("batch", batch), ("seq", seq)):
                low, _, high = dims.get(name, (size, size, size))
                if not low <= size <= high:
                    raise AttnresError(f"--shapes {batch},{seq}: {name} {size} is outside the exported range "
                                       f"{low}..{high}; pick a shape inside it or re-export with a wider --{name}")


def default_shapes(dims: dict[str, list[int]]) -> list[tuple[int, int]]:
    """The opt shape and the largest batch with the fewest tokens, from recorded batch/seq ranges."""
    from attnres_export.dims import DimRange, check_shapes

    if "batch" not in dims or "seq" not in dims:
        raise AttnresError("no batch/seq ranges recorded in the artifacts; pass --shapes B,T")
    return [tuple(s) for s in check_shapes({k: DimRange(*dims[k]) for k in ("batch", "seq")})]


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
