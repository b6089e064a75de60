"""On a GPU machine with TensorRT: plugin build, engine build, parity and benchmark end to end."""

from __future__ import annotations

import json
import subprocess
import sys

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
    from attnres_export.exporter.checkpoint import export_checkpoint
    from attnres_export.exporter.options import ExportOptions
    from attnres_export.models import save_checkpoint
    from attnres_export.models.attnres_lm import AttnResLMConfig
    from attnres_export.models.example import make_example
    from attnres_export.plugins.build import build_plugins

    root = tmp_path_factory.mktemp("trt")
    libs = build_plugins()
    if libs.trt is None:
        pytest.skip("the plugin build found no TensorRT headers (set TENSORRT_ROOT)")
    cfg = AttnResLMConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=64)
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


def test_engine_matches_the_float32_reference(built, tmp_path):
    checkpoint, onnx_path, engine = built
    report = tmp_path / "parity.json"
    result = CliRunner().invoke(app, ["check", str(checkpoint), "--onnx", str(onnx_path), "--engine", str(engine),
                                      "--report", str(report)])
    assert result.exit_code == 0, result.output
    rows = [c for c in json.loads(report.read_text())["checks"] if c["backend"] == "tensorrt"]
    assert rows and all(c["ok"] and c["artifact"] == engine.name for c in rows)


def test_bench_runs_the_engine_with_cuda_graphs_against_the_onnx(built):
    _, onnx_path, engine = built
    result = CliRunner().invoke(app, ["bench", str(engine), "--cuda-graph", "--compare", str(onnx_path),
                                      "--iterations", "5", "--warmup", "2"])
    assert result.exit_code == 0, result.output
    assert "CUDA events" in result.output
    assert f"{onnx_path.name} / {engine.name} at " in result.output and "x median latency" in result.output


def test_an_embedded_plugin_engine_runs_in_a_process_that_loads_no_library(built, tmp_path):
    """--embed-plugin end to end, each step in its own process (this one has the static library loaded)."""
    from attnres_export.plugins.build import find_libraries

    checkpoint, onnx_path, _ = built
    engine = tmp_path / "embedded.engine"
    attnres = [sys.executable, "-c", "import sys; from attnres_export.cli import app; sys.argv[0] = 'attnres'; app()"]
    build = subprocess.run([*attnres, "build", str(onnx_path), "-o", str(engine), "--embed-plugin", "--plugin",
                            str(find_libraries().trt_dyn)], capture_output=True, text=True, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    assert json.loads(engine.with_name(engine.name + ".json").read_text())["plugin_embedded"], build.stderr
    check = subprocess.run([*attnres, "check", str(checkpoint), "--engine", str(engine), "--allow-engine-host-code"],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
