"""plugin_library: one load per library and process, libnvinfer promotion, and the TensorRT major check of resolve().

No TensorRT, no GPU, no build: fake registries, fake ctypes and fake build-info.json files.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import types
from pathlib import Path

import pytest

from attnres_export.backends.tensorrt import plugin_library
from attnres_export.errors import EngineError
from attnres_export.plugins import build


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new process would: nothing loaded, TensorRT not imported."""
    monkeypatch.setattr(plugin_library, "_loaded", {})
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)


class FakeRegistry:
    """TensorRT's loadLibrary: a handle the first time, None once the creators are registered."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def load_library(self, path: str) -> object | None:
        self.calls.append(path)
        return object() if self.calls.count(path) == 1 else None


def _fake_trt(registry: FakeRegistry) -> types.SimpleNamespace:
    return types.SimpleNamespace(__version__="11.1.0", get_plugin_registry=lambda: registry)


def _library(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"")
    return path


def test_dyn_library_is_loaded_once_per_process(tmp_path: Path) -> None:
    registry = FakeRegistry()
    dyn = _library(tmp_path, build.TRT_DYN_LIB)
    plugin_library.load(_fake_trt(registry), dyn)
    plugin_library.load(_fake_trt(registry), dyn)
    plugin_library.load(_fake_trt(registry), tmp_path / "." / build.TRT_DYN_LIB)  # same file, other spelling
    assert registry.calls == [str(dyn)]


def test_a_refused_dyn_load_names_the_static_library_already_loaded(tmp_path: Path, monkeypatch) -> None:
    static = _library(tmp_path, build.TRT_LIB)
    dyn = _library(tmp_path, build.TRT_DYN_LIB)
    monkeypatch.setattr(plugin_library.ctypes, "CDLL", _fake_cdll([]))
    plugin_library.load(_fake_trt(FakeRegistry()), static)
    registry = FakeRegistry()
    registry.load_library = lambda path: None
    with pytest.raises(EngineError, match=rf"{build.TRT_LIB} is already loaded in this process") as caught:
        plugin_library.load(_fake_trt(registry), dyn)
    assert len(str(caught.value).splitlines()) == 1


def _fake_cdll(calls: list[tuple[str, int]], loaded: tuple[str, ...] = ()):
    """ctypes.CDLL that records (name, mode); RTLD_NOLOAD succeeds only for names in ``loaded``."""

    def cdll(name: str, mode: int = 0) -> object:
        calls.append((name, mode))
        if mode & os.RTLD_NOLOAD and name not in loaded:
            raise OSError(f"{name}: cannot open shared object file")
        return object()

    return cdll


def test_static_library_is_loaded_once_and_libnvinfer_promoted_first(tmp_path: Path, monkeypatch) -> None:
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(plugin_library.ctypes, "CDLL", _fake_cdll(calls, loaded=("libnvinfer.so.10",)))
    static = _library(tmp_path, build.TRT_LIB)
    plugin_library.load(_fake_trt(FakeRegistry()), static)
    plugin_library.load(_fake_trt(FakeRegistry()), static)
    loads = [(name, mode) for name, mode in calls if not mode & os.RTLD_NOLOAD]
    assert loads == [(str(static), ctypes.RTLD_GLOBAL)]
    promotions = [name for name, mode in calls if mode == os.RTLD_NOLOAD | os.RTLD_GLOBAL]
    assert promotions == list(plugin_library.NVINFER_NAMES)  # tried every name once, before the library
    assert calls.index(("libnvinfer.so.10", os.RTLD_NOLOAD | os.RTLD_GLOBAL)) < calls.index(loads[0])


def test_promotion_without_a_loaded_libnvinfer_is_a_no_op() -> None:
    # Nothing in the test process loaded libnvinfer: RTLD_NOLOAD fails for every name and nothing is loaded.
    assert plugin_library.promote_nvinfer() == []


def test_a_library_that_fails_to_load_is_not_remembered(tmp_path: Path, monkeypatch) -> None:
    static = _library(tmp_path, build.TRT_LIB)

    def failing(name: str, mode: int = 0) -> object:
        raise OSError(f"{name}: undefined symbol: getPluginRegistry\nmore")

    monkeypatch.setattr(plugin_library.ctypes, "CDLL", failing)
    for _ in range(2):
        with pytest.raises(EngineError, match="undefined symbol: getPluginRegistry; rebuild") as caught:
            plugin_library.load(_fake_trt(FakeRegistry()), static)
        assert len(str(caught.value).splitlines()) == 1


def _fake_build(cache: Path, name: str, version: str | None, age: int) -> Path:
    """A build folder as build_plugins leaves it (empty library files), ``age`` seconds old."""
    folder = cache / name
    lib = folder / "lib"
    libs = {"kernels": _library(lib, build.KERNELS_LIB)}
    if version is not None:
        libs |= {"trt": _library(lib, build.TRT_LIB), "trt_dyn": _library(lib, build.TRT_DYN_LIB)}
    info = {"hash": name, "libraries": {k: str(v) for k, v in libs.items()}, "tensorrt_version": version,
            "tensorrt_include": "/x/include" if version else None, "cuda_archs": "80-real"}
    info_path = folder / build.INFO_FILE
    info_path.write_text(json.dumps(info))
    stamp = 1_700_000_000 - age
    os.utime(info_path, (stamp, stamp))
    return lib


def _import_tensorrt(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__=version))


def test_resolve_refuses_an_explicit_library_built_for_another_major(tmp_path: Path, monkeypatch) -> None:
    lib = _fake_build(tmp_path, "a", "10.3.0", age=0)
    _import_tensorrt(monkeypatch, "11.1.0")
    with pytest.raises(EngineError, match=r"built against TensorRT 10\.3\.0 headers but this process runs "
                                          r"TensorRT 11\.1\.0") as caught:
        plugin_library.resolve(lib / build.TRT_LIB)
    assert len(str(caught.value).splitlines()) == 1
    _import_tensorrt(monkeypatch, "10.16.0")
    assert plugin_library.resolve(lib / build.TRT_DYN_LIB, dynamic=True) == lib / build.TRT_DYN_LIB


def test_resolve_checks_nothing_while_tensorrt_is_not_imported(tmp_path: Path) -> None:
    lib = _fake_build(tmp_path, "a", "10.3.0", age=0)
    assert plugin_library.resolve(lib / build.TRT_LIB) == lib / build.TRT_LIB
    assert "tensorrt" not in sys.modules


def test_resolve_prefers_the_latest_build_for_the_running_major(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ATTNRES_PLUGIN_CACHE", str(tmp_path))
    older = _fake_build(tmp_path, "old", "10.3.0", age=100)
    newer = _fake_build(tmp_path, "new", "11.1.0", age=10)
    _fake_build(tmp_path, "kernels-only", None, age=0)
    # TensorRT not imported: the latest build with TensorRT libraries (the newer kernels-only one has none).
    assert plugin_library.resolve(None) == newer / build.TRT_LIB
    _import_tensorrt(monkeypatch, "10.3.0")
    assert plugin_library.resolve(None) == older / build.TRT_LIB
    assert plugin_library.resolve(None, dynamic=True) == older / build.TRT_DYN_LIB


def test_resolve_refuses_when_only_builds_for_another_major_exist(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ATTNRES_PLUGIN_CACHE", str(tmp_path))
    _fake_build(tmp_path, "new", "11.1.0", age=10)
    _import_tensorrt(monkeypatch, "10.3.0")
    with pytest.raises(EngineError, match=r"TensorRT 11\.1\.0 headers but this process runs TensorRT 10\.3\.0; "
                                          r"rebuild it with `attnres plugin build --tensorrt-root DIR` "
                                          r"for TensorRT 10"):
        plugin_library.resolve(None)


def test_recorded_version_only_for_a_library_of_that_build(tmp_path: Path) -> None:
    lib = _fake_build(tmp_path, "a", "11.1.0", age=0)
    assert build.recorded_tensorrt_version(lib / build.TRT_LIB) == "11.1.0"
    stray = _library(lib, "libother.so")
    assert build.recorded_tensorrt_version(stray) is None
    assert build.recorded_tensorrt_version(tmp_path / "nowhere.so") is None


def _fake_shared_build(cache: Path, version: str, age: int) -> Path:
    """A kernels folder with one tensorrt-<key> folder inside, as build_plugins leaves a full build."""
    kernels = _fake_build(cache, "kernels-key", None, age=age + 5)
    folder = cache / "kernels-key" / f"{build.TENSORRT_DIR_PREFIX}trt-key"
    lib = folder / "lib"
    libs = {"kernels": kernels / build.KERNELS_LIB, "trt": _library(lib, build.TRT_LIB),
            "trt_dyn": _library(lib, build.TRT_DYN_LIB)}
    info = {"hash": "trt-key", "libraries": {k: str(v) for k, v in libs.items()}, "tensorrt_version": version,
            "tensorrt_include": "/x/include", "cuda_archs": "80-real"}
    (folder / build.INFO_FILE).write_text(json.dumps(info))
    stamp = 1_700_000_000 - age
    os.utime(folder / build.INFO_FILE, (stamp, stamp))
    return lib


def test_resolve_finds_tensorrt_libraries_inside_the_kernels_folder(tmp_path: Path, monkeypatch) -> None:
    """The TensorRT libraries of a full build live in kernels-folder/tensorrt-<key>/lib: found there, their version
    read from the build-info.json beside them, and the kernels-only record of the same folder does not hide them."""
    monkeypatch.setenv("ATTNRES_PLUGIN_CACHE", str(tmp_path))
    lib = _fake_shared_build(tmp_path, "11.1.0", age=10)
    assert plugin_library.resolve(None) == lib / build.TRT_LIB
    assert plugin_library.resolve(None, dynamic=True) == lib / build.TRT_DYN_LIB
    assert build.recorded_tensorrt_version(lib / build.TRT_LIB) == "11.1.0"
    found = build.find_libraries()
    assert found is not None and found.kernels == tmp_path / "kernels-key" / "lib" / build.KERNELS_LIB
    _import_tensorrt(monkeypatch, "10.3.0")
    with pytest.raises(EngineError, match=r"TensorRT 11\.1\.0 headers but this process runs TensorRT 10\.3\.0"):
        plugin_library.resolve(None)
