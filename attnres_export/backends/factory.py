"""Which runner serves an artifact file, and in which dtype it was exported (the dtype picks the pass bar)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from attnres_export.backends.base import Runner
from attnres_export.backends.onnxruntime.providers import PROVIDERS
from attnres_export.backends.onnxruntime.runner import OnnxRuntimeCudaRunner, OnnxRuntimeRunner
from attnres_export.errors import ParityError
from attnres_export.graphs.load import load_onnx
from attnres_export.graphs.metadata import onnx_dtype

if TYPE_CHECKING:
    from attnres_export.backends.tensorrt.runner import TensorRTRunner


def onnx_runner_class(provider: str = "cpu") -> type[OnnxRuntimeRunner]:
    """The ONNX Runtime runner of ``provider`` (one of ``PROVIDERS``)."""
    if provider not in PROVIDERS:
        raise ParityError(f"--ort-provider {provider!r}: choose one of {', '.join(PROVIDERS)}")
    return dict(zip(PROVIDERS, (OnnxRuntimeRunner, OnnxRuntimeCudaRunner), strict=True))[provider]


def onnx_runner(path: Path, provider: str = "cpu") -> tuple[Runner, str, onnx.ModelProto]:
    """An ONNX Runtime runner for ``path`` (``cpu`` or ``cuda``), its dtype, and the loaded model."""
    runner_class = onnx_runner_class(provider)
    model = load_onnx(path)
    return runner_class(model, artifact=path.name), onnx_dtype(model), model


def engine_runner(path: Path, plugin: Path | None = None, allow_engine_host_code: bool = False,
                  dtype: str | None = None) -> tuple[TensorRTRunner, str | None]:
    """A TensorRT runner for the engine at ``path`` and its dtype: the manifest's, else (an engine built by trtexec
    or Polygraphy, run with ``plugin``) ``dtype`` or what the engine's I/O tensors tell; None when neither says
    (``TensorRTRunner.storage_dtype``)."""
    from attnres_export.backends.tensorrt.runner import TensorRTRunner

    runner = TensorRTRunner(path, plugin=plugin, allow_engine_host_code=allow_engine_host_code)
    return runner, runner.storage_dtype(dtype)
