"""Which runner serves an artifact file, and in which dtype it was exported (the dtype picks the pass bar)."""

from __future__ import annotations

from pathlib import Path

import onnx

from attnres_export.backends.base import Runner
from attnres_export.backends.engine_manifest import read_manifest
from attnres_export.backends.onnxruntime_runner import OnnxRuntimeCudaRunner, OnnxRuntimeRunner
from attnres_export.errors import ParityError
from attnres_export.graphs.load import load_onnx
from attnres_export.graphs.metadata import onnx_dtype


def onnx_runner(path: Path, provider: str = "cpu") -> tuple[Runner, str, onnx.ModelProto]:
    """An ONNX Runtime runner for ``path`` (``cpu`` or ``cuda``), its dtype, and the loaded model."""
    model = load_onnx(path)
    runner_class = {"cpu": OnnxRuntimeRunner, "cuda": OnnxRuntimeCudaRunner}.get(provider)
    if runner_class is None:
        raise ParityError(f"--ort-provider {provider!r}: choose cpu or cuda")
    return runner_class(model, artifact=path.name), onnx_dtype(model), model


def engine_runner(path: Path, plugin: Path | None = None) -> tuple[Runner, str]:
    """A TensorRT runner for the engine at ``path`` and the dtype from its manifest."""
    from attnres_export.backends.tensorrt_runner import TensorRTRunner

    manifest = read_manifest(path)
    if manifest is None:
        raise ParityError(f"{path}: no manifest {path.name}.json beside it; build engines with `attnres build`")
    return TensorRTRunner(path, plugin=plugin, manifest=manifest), manifest.dtype
