"""Finding and loading the plugin library in the way each use needs (docs/op-set.md#plugins: two libraries, one source).

``libattnres_trt.so`` registers its creators when loaded (ctypes); ``libattnres_trt_dyn.so`` is loaded by
TensorRT's registry and is the only one that can be serialized into an engine. Loading both fails; loading
one of them again is a no-op (the handle is kept per resolved path).
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from types import ModuleType

from attnres_export.errors import EngineError
from attnres_export.plugins.build import TRT_DYN_LIB, TRT_LIB, find_libraries, recorded_tensorrt_version
from attnres_export.plugins.toolchain import major_of

BUILD_HINT = "run `attnres plugin build --tensorrt-root DIR` or pass --plugin PATH"

NVINFER_NAMES = ("libnvinfer.so.11", "libnvinfer.so.10", "libnvinfer.so")
"""Sonames of a libnvinfer that may already be loaded (pip loads libnvinfer.so.<major> RTLD_LOCAL)."""

_loaded: dict[Path, object] = {}
"""Resolved path -> what loading it returned (registry handle or CDLL), for this process."""


def is_dynamic(path: Path) -> bool:
    """The ``_dyn`` library (exported getCreators, no self-registration)?"""
    return "_dyn" in Path(path).name


def _running_tensorrt() -> str | None:
    """``tensorrt.__version__`` when TensorRT is already imported (never imports it)."""
    module = sys.modules.get("tensorrt")
    version = getattr(module, "__version__", None) if module is not None else None
    return version if isinstance(version, str) else None


def _check_tensorrt_major(path: Path, built_with: str | None) -> None:
    """Refuse a library compiled against the headers of another TensorRT major than the imported one."""
    running = _running_tensorrt()
    if running is None or built_with is None:
        return
    if major_of(built_with) != major_of(running):
        raise EngineError(f"plugin library {path} was built against TensorRT {built_with} headers but this process "
                          f"runs TensorRT {running}; rebuild it with `attnres plugin build --tensorrt-root DIR` for "
                          f"TensorRT {major_of(running)}")


def resolve(explicit: Path | None, dynamic: bool = False) -> Path:
    """The library to use: ``explicit`` or the latest ``attnres plugin build``; the _dyn one when ``dynamic``.

    The latest build is the latest with TensorRT libraries (a later kernels-only build does not hide it). With
    TensorRT already imported, the latest build for the running major is preferred over a newer build for another
    one, and a library whose build-info.json records another TensorRT major is refused.
    """
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise EngineError(f"plugin library {path} does not exist; {BUILD_HINT}")
        if dynamic and not is_dynamic(path):
            raise EngineError(f"--embed-plugin needs {TRT_DYN_LIB} (exports getCreators), got {path.name}; "
                              f"pass --plugin {path.with_name(TRT_DYN_LIB)}")
        _check_tensorrt_major(path, recorded_tensorrt_version(path))
        return path
    running = major_of(_running_tensorrt())
    built = (find_libraries(tensorrt_major=running) if running is not None else None) or find_libraries(
        with_tensorrt=True)
    path = None if built is None else (built.trt_dyn if dynamic else built.trt)
    if path is None:
        raise EngineError(f"no {TRT_DYN_LIB if dynamic else TRT_LIB} found; {BUILD_HINT}")
    _check_tensorrt_major(Path(path), built.tensorrt_version)
    return Path(path)


def promote_nvinfer() -> list[str]:
    """Put an already-loaded libnvinfer into the global symbol scope; returns the names promoted.

    pip's tensorrt loads libnvinfer with ctypes (RTLD_LOCAL), where a plugin library loaded later cannot see
    it. RTLD_NOLOAD loads nothing new: a name that is not loaded raises OSError and is skipped.
    """
    promoted = []
    for name in NVINFER_NAMES:
        try:
            ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        except OSError:
            continue
        promoted.append(name)
    return promoted


def load(trt: ModuleType, path: Path) -> None:
    """Register the creators of ``path`` with TensorRT (registry load for _dyn, ctypes otherwise), once per process."""
    path = Path(path)
    if not path.is_file():
        raise EngineError(f"plugin library {path} does not exist; {BUILD_HINT}")
    key = path.resolve()
    if key in _loaded:
        return
    other = next((p for p in _loaded if is_dynamic(p) != is_dynamic(key)), None)
    promote_nvinfer()
    if is_dynamic(path):
        try:
            handle = trt.get_plugin_registry().load_library(str(path))
        except RuntimeError:
            handle = None
        if handle is None:
            cause = (f"{other} is already loaded in this process" if other is not None else
                     f"its creators already registered by {TRT_LIB} in this process, or built for another TensorRT")
            raise EngineError(f"TensorRT could not load {path} ({cause}); load only one of the two libraries")
        _loaded[key] = handle
        return
    try:
        _loaded[key] = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise EngineError(f"cannot load plugin library {path}: {str(exc).splitlines()[0]}; "
                          "rebuild it for this CUDA/TensorRT with `attnres plugin build`") from exc
