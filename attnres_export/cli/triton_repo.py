"""``attnres triton-repo``: a model folder of a Triton model repository for a stock Triton server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli.framework import app, command, console
from attnres_export.cli.options import AllowEngineHostCode, Plugin


@command(app, name="triton-repo")
def triton_repo(
    artifact: Annotated[Path, typer.Argument(help="TensorRT engine, or a portable ONNX (standard ops only).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Model repository folder (created if missing).")],
    model_name: Annotated[str | None, typer.Option(help="Model folder and name [the file's stem].")] = None,
    instances: Annotated[int, typer.Option(help="Instances per group (per GPU, per optimization profile).")] = 1,
    max_batch: Annotated[int | None, typer.Option(help="max_batch_size [the artifact's batch range maximum].")
                         ] = None,
    max_queue_delay_us: Annotated[int, typer.Option(help="Dynamic batcher queue delay in microseconds.")] = 2000,
    gpus: Annotated[str | None, typer.Option(help="GPU indices, e.g. 0,1: one instance group per GPU (ONNX), "
                                                  "or these GPUs in every profile's group (engines).")] = None,
    kind: Annotated[str, typer.Option(help="ONNX only: instance kind auto, cpu or gpu [auto: gpu with --gpus].")
                    ] = "auto",
    cuda_graphs: Annotated[bool, typer.Option(help="Engines: let the TensorRT backend capture CUDA graphs.")] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing model folder of the same name.")] = False,
    plugin: Plugin = None,
    allow_engine_host_code: AllowEngineHostCode = False,
) -> None:
    """Write REPO/NAME (config.pbtxt checked against Triton's schema, 1/model.plan or 1/model.onnx, plugin)."""
    from attnres_export.errors import AttnresError
    from attnres_export.serve.repository import RepoOptions, write_repository

    try:
        gpu_list = [int(g) for g in gpus.split(",")] if gpus else []
    except ValueError:
        raise AttnresError(f"--gpus {gpus!r}: expected GPU indices like 0,1") from None
    result = write_repository(RepoOptions(artifact, output, model_name, instances, max_batch, max_queue_delay_us,
                                          gpu_list, kind, cuda_graphs, plugin, allow_engine_host_code, overwrite))
    console.print(f"wrote [bold]{result.model_dir}[/bold] ({result.backend} model, config.pbtxt checked against "
                  "Triton's ModelConfig schema)", highlight=False)
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(f"start Triton with: {result.launch}", highlight=False, soft_wrap=True)
