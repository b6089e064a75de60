"""A with-past ONNX builds on the strict TensorRT fake: the optimization profile derived from the export metadata
covers past length 0 (prefill) up to the exported maximum for every past input, and the engine's input axes (from
its manifest) give `attnres generate --engine` its cache layout. TensorRT itself is not installable here and the
fake runs nothing: generating on an engine is not tested."""

from __future__ import annotations

import pytest

from attnres_export.backends.tensorrt.builder import BuildOptions, build_engine
from attnres_export.backends.tensorrt.runner import TensorRTRunner
from attnres_export.dims import DimRange
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from tests.backends.tensorrt.conftest import fake_trt, libraries  # noqa: F401 - fixtures
from tests.conftest import write_checkpoint


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory):
    """Exported before the fake ``tensorrt`` is installed (torch.export fails with the fake in sys.modules)."""
    tmp = tmp_path_factory.mktemp("with-past-engine")
    ckpt = write_checkpoint(tmp / "m.pt", seed=1, n_layers=2, block_size=2)
    out = tmp / "m.float16.with-past.tensorrt.onnx"
    export_checkpoint(ExportOptions(ckpt, out, dtype="float16", batch=DimRange(1, 1, 4), seq=DimRange(1, 1, 16),
                                    past=DimRange(0, 8, 40), with_past=True, check=False))
    return out


@pytest.mark.slow
def test_with_past_onnx_builds_with_a_profile_from_past_zero(onnx_path, fake_trt, libraries, tmp_path):  # noqa: F811
    engine = tmp_path / "m.engine"
    result = build_engine(BuildOptions(onnx_path, engine, plugin=libraries.trt))
    profiles = result.manifest.profiles
    profile = profiles[0] if isinstance(profiles, list) else profiles
    for i in range(2):
        for kind in ("key", "value"):
            shapes = profile[f"past_key_values.{i}.{kind}"]
            assert (shapes["min"], shapes["opt"], shapes["max"]) == ([1, 4, 0, 8], [1, 4, 8, 8], [4, 4, 40, 8])
    assert (profile["attention_mask"]["min"], profile["attention_mask"]["max"]) == ([1, 1], [4, 56])
    axes = TensorRTRunner(engine, plugin=libraries.trt).input_axes()
    assert axes["past_key_values.1.value"] == ["batch", 4, "past", 8]
    assert axes["attention_mask"] == ["batch", "total"]
