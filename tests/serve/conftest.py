"""Serving tests: small exports shared by the module, and the TensorRT fake's fixtures
(tests/backends/tensorrt/conftest.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import onnx
import pytest

from tests.backends.tensorrt.conftest import fake_trt, libraries  # noqa: F401 - the TensorRT fake, for engines

HAS_CLIENT = importlib.util.find_spec("tritonclient") is not None
HAS_SERVER = HAS_CLIENT and importlib.util.find_spec("pytriton") is not None
NEEDS_CLIENT = pytest.mark.skipif(not HAS_CLIENT, reason="the serve extra is missing (tritonclient): "
                                                         "pip install -e .[test,serve]")
NEEDS_SERVER = pytest.mark.skipif(not HAS_SERVER, reason="the serve extra is missing (nvidia-pytriton, "
                                                         "tritonclient): pip install -e .[test,serve]")


@pytest.fixture(scope="session")
def served_onnx(block2_checkpoint, tmp_path_factory) -> Path:
    """A float32 --target tensorrt export (attnres nodes), batch 1:4:16, seq 1:8:64."""
    from attnres_export.dims import DimRange
    from attnres_export.exporter.checkpoint import export_checkpoint
    from attnres_export.exporter.options import ExportOptions

    out = tmp_path_factory.mktemp("serve") / "tiny.tensorrt.onnx"
    export_checkpoint(ExportOptions(block2_checkpoint, out, batch=DimRange(1, 4, 16), seq=DimRange(1, 8, 64),
                                    check=False))
    return out


@pytest.fixture
def portable_onnx(tmp_path) -> Path:
    """A hand-built standard-op ONNX with attnres-export metadata (tests/serve/models.py)."""
    from tests.serve.models import tiny_onnx

    return tiny_onnx(tmp_path / "tiny.portable.onnx")


@pytest.fixture
def attnres_onnx(tmp_path) -> Path:
    """An ONNX with one AttnResAggregate node (what `--target tensorrt` writes)."""
    from tests.backends.tensorrt.graphs import aggregate_model

    path = tmp_path / "agg.tensorrt.onnx"
    onnx.save(aggregate_model(), str(path))
    return path


@pytest.fixture
def fake_engine(fake_trt, libraries, portable_onnx, tmp_path, monkeypatch) -> Path:  # noqa: F811
    """``portable_onnx`` built on the TensorRT fake (batch 1:2:4, static plugin), with CUDA reported present
    because the fake deserializes without a GPU."""
    import torch

    from attnres_export.backends.tensorrt.builder import BuildOptions, build_engine
    from attnres_export.dims import DimRange

    engine = tmp_path / "m.engine"
    build_engine(BuildOptions(portable_onnx, engine, plugin=libraries.trt, batch=DimRange(1, 2, 4)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return engine
