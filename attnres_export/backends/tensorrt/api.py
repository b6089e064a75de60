"""The lazily imported TensorRT Python API: one place that says how to get it when it is missing."""

from __future__ import annotations

import functools
import re
from types import ModuleType

from attnres_export.errors import EngineError

MISSING_TENSORRT = ("TensorRT is not installed: on a machine with an NVIDIA GPU run `pip install tensorrt` "
                    "(TensorRT 10 or 11), or check the engine on ONNX Runtime with `attnres check --onnx`")


def require_tensorrt() -> ModuleType:
    """``import tensorrt``, or an EngineError naming the fix."""
    try:
        import tensorrt
    except ImportError:
        raise EngineError(MISSING_TENSORRT) from None
    return tensorrt


def version_tuple(text: str) -> tuple[int, int]:
    """``"10.7.0.23"`` -> ``(10, 7)``."""
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise EngineError(f"cannot read the TensorRT version {text!r}")
    return int(match.group(1)), int(match.group(2))


@functools.cache
def logger(trt: ModuleType):
    """One logger per process: TensorRT warns when builders and runtimes get different loggers."""
    return trt.Logger(trt.Logger.WARNING)
