"""The strict TensorRT fake (tests/backends/tensorrt/fake_tensorrt) installed as ``tensorrt``, once per TensorRT
version."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from attnres_export.backends.tensorrt import plugin_library
from tests.conftest import slow_after

FAKE_ROOT = Path(__file__).parent / "fake_tensorrt"
FAKE_VERSIONS = ("10.3.0", "10.16.0", "11.1.0")
ATTNRES_CREATORS = [("AttnResAggregate", "1", "attnres"), ("AttnResAggregateNorm", "1", "attnres"),
                    ("ResidualScoreAttention", "1", "attnres")]


@pytest.fixture(params=slow_after(FAKE_VERSIONS))
def fake_trt(request, monkeypatch) -> ModuleType:
    """A fresh fake ``tensorrt`` (empty plugin registry) of one version: in sys.modules for this process, on
    PYTHONPATH with ATTNRES_FAKE_TENSORRT for subprocesses; ctypes loading of plugin libraries goes through it."""
    monkeypatch.setenv("ATTNRES_FAKE_TENSORRT", request.param)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(FAKE_ROOT), os.environ.get("PYTHONPATH")) if p))
    for name in [n for n in sys.modules if n == "tensorrt" or n.startswith("tensorrt.")]:
        monkeypatch.delitem(sys.modules, name)
    spec = importlib.util.spec_from_file_location("tensorrt", FAKE_ROOT / "tensorrt" / "__init__.py",
                                                  submodule_search_locations=[str(FAKE_ROOT / "tensorrt")])
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "tensorrt._bindings", sys.modules["tensorrt._bindings"])
    monkeypatch.setattr(plugin_library, "ctypes", SimpleNamespace(
        CDLL=lambda path, mode=0: module._dlopen(path), RTLD_GLOBAL=ctypes.RTLD_GLOBAL))
    return module


@pytest.fixture
def libraries(fake_trt, tmp_path) -> SimpleNamespace:
    """``libattnres_trt.so`` (registers itself when loaded) and ``libattnres_trt_dyn.so`` (exports getCreators)
    as fake libraries, in a folder of their own."""
    folder = tmp_path / "lib"
    folder.mkdir()
    static, dynamic = folder / "libattnres_trt.so", folder / "libattnres_trt_dyn.so"
    static.write_text(fake_trt._plugin_library(ATTNRES_CREATORS, dynamic=False))
    dynamic.write_text(fake_trt._plugin_library(ATTNRES_CREATORS, dynamic=True))
    return SimpleNamespace(trt=static, trt_dyn=dynamic)


@pytest.fixture
def gpu_visible(monkeypatch) -> None:
    """torch reports a CUDA GPU, so the runner gets past its GPU check to TensorRT (the fake needs none)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
