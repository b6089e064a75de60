"""Finding and loading the plugin library in the way each use needs (docs/op-set.md#plugins: two libraries, one source).

``libattnres_trt.so`` registers its creators when loaded (ctypes); ``libattnres_trt_dyn.so`` is loaded by
TensorRT's registry and is the only one that can be serialized into an engine. Loading both fails.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import ModuleType

from attnres_export.errors import EngineError
from attnres_export.plugins.build import TRT_DYN_LIB, TRT_LIB, find_libraries

BUILD_HINT = "run `attnres plugin build --tensorrt-root DIR` or pass --plugin PATH"


def is_dynamic(path: Path) -> bool:
    """The ``_dyn`` library (exported getCreators, no self-registration)?"""
    return "_dyn" in Path(path).name


def resolve(explicit: Path | None, dynamic: bool = False) -> Path:
    """The library to use: ``explicit`` or the latest ``attnres plugin build``; the _dyn one when ``dynamic``."""
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise EngineError(f"plugin library {path} does not exist; {BUILD_HINT}")
        if dynamic and not is_dynamic(path):
            raise EngineError(f"--embed-plugin needs {TRT_DYN_LIB} (exports getCreators), got {path.name}; "
                              f"pass --plugin {path.with_name(TRT_DYN_LIB)}")
        return path
    built = find_libraries()
    path = None if built is None else (built.trt_dyn if dynamic else built.trt)
    if path is None:
        raise EngineError(f"no {TRT_DYN_LIB if dynamic else TRT_LIB} found; {BUILD_HINT}")
    return Path(path)


def load(trt: ModuleType, path: Path) -> None:
    """Register the creators of ``path`` with TensorRT (registry load for _dyn, ctypes otherwise)."""
    path = Path(path)
    if not path.is_file():
        raise EngineError(f"plugin library {path} does not exist; {BUILD_HINT}")
    if is_dynamic(path):
        try:
            handle = trt.get_plugin_registry().load_library(str(path))
        except RuntimeError:
            handle = None
        if handle is None:
            raise EngineError(f"TensorRT could not load {path} (its creators already registered by {TRT_LIB} "
                              "in this process, or built for another TensorRT); load only one of the two libraries")
        return
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise EngineError(f"cannot load plugin library {path}: {str(exc).splitlines()[0]}; "
                          "rebuild it for this CUDA/TensorRT with `attnres plugin build`") from exc
