"""On a GPU machine with TensorRT: plugin build, engine build, parity and benchmark end to end."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attnres_export.cli import app

pytest.importorskip("tensorrt", reason="TensorRT is not installed (needs an NVIDIA GPU machine)")
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from attnres_export.dims import DimRange
    from attnres_export.exporter.export import ExportOptions, export_checkpoint
    from attnres_export.models import ModelConfig, save_checkpoint
    from attnres_export.models.example import make_example
    from attnres_export.plugins.build import build_plugins

    root = tmp_path_factory.mktemp("trt")
    libs = build_plugins()
    if libs.trt is None:
        pytest.skip("the plugin build found no TensorRT headers (set TENSORRT_ROOT)")
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=64)
    checkpoint = root / "m.pt"
    save_checkpoint(make_example(cfg), cfg, checkpoint)
    onnx_path = root / "m.onnx"
    export_checkpoint(ExportOptions(checkpoint, onnx_path, batch=DimRange(1, 2, 4), seq=DimRange(1, 16, 64)))
    engine = root / "m.engine"
    result = CliRunner().invoke(app, ["build", str(onnx_path), "-o", str(engine), "--plugin", str(libs.trt)])
    assert result.exit_code == 0, result.output
    return checkpoint, onnx_path, engine


def test_every_aggregation_runs_as_the_plugin_and_the_manifest_says_so(built):
    _, _, engine = built
    manifest = json.loads(engine.with_name(engine.name + ".json").read_text())
    assert manifest["plugin_nodes"] and not manifest["inlined_nodes"] and len(manifest["plugin_sha256"]) == 64


def test_engine_matches_the_float32_reference(built):
    checkpoint, onnx_path, engine = built
    result = CliRunner().invoke(app, ["check", str(checkpoint), "--onnx", str(onnx_path), "--engine", str(engine)])
    assert result.exit_code == 0, result.output


def test_bench_runs_the_engine_with_cuda_graphs_against_the_onnx(built):
    _, onnx_path, engine = built
    result = CliRunner().invoke(app, ["bench", str(engine), "--cuda-graph", "--compare", str(onnx_path),
                                      "--iterations", "5", "--warmup", "2"])
    assert result.exit_code == 0, result.output
    assert "CUDA events" in result.output
