"""``attnres check`` end to end on the CPU: the TensorRT-bound ONNX (reference ops), portable and ort-trt."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attnres_export.cli import app


def invoke(*args: str):
    return CliRunner().invoke(app, ["check", *map(str, args)])


def test_check_passes_for_tensorrt_portable_and_ort_trt_onnx_at_the_default_shapes(artifacts, tmp_path):
    report = tmp_path / "report.json"
    result = invoke(artifacts.checkpoint, "--onnx", artifacts.tensorrt, "--onnx", artifacts.portable,
                    "--onnx", artifacts.ort_trt, "--report", report)
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["ok"] is True
    assert {c["artifact"] for c in data["checks"]} == {"tiny.tensorrt.onnx", "tiny.portable.onnx",
                                                      "tiny.ort-trt.onnx"}
    assert {tuple(c["shape"]) for c in data["checks"]} == {(2, 4), (3, 1)}
    assert {c["backend"] for c in data["checks"]} == {"onnxruntime+ref-ops", "onnxruntime"}
    for column in ("backend", "artifact", "shape", "output", "max abs", "rel L2", "cosine", "pass"):
        assert column in result.output


@pytest.mark.slow
def test_a_perturbed_onnx_misses_its_bar_and_check_exits_1(artifacts, tmp_path):
    report = tmp_path / "report.json"
    result = invoke(artifacts.checkpoint, "--onnx", artifacts.tensorrt, "--onnx", artifacts.perturbed,
                    "--shapes", "2,4", "--report", report)
    assert result.exit_code == 1
    assert "parity check failed" in result.output and "NO" in result.output
    verdicts = {c["artifact"]: c["ok"] for c in json.loads(report.read_text())["checks"]}
    assert verdicts == {"tiny.tensorrt.onnx": True, "tiny.perturbed.onnx": False}


@pytest.mark.slow
def test_a_loose_enough_tol_override_lets_the_perturbed_onnx_pass(artifacts):
    result = invoke(artifacts.checkpoint, "--onnx", artifacts.perturbed, "--shapes", "1,3",
                    "--tol", "float32:10:0")
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_explicit_shapes_replace_the_metadata_defaults(artifacts, tmp_path):
    report = tmp_path / "r.json"
    result = invoke(artifacts.checkpoint, "--onnx", artifacts.tensorrt, "--shapes", "1,5", "--report", report)
    assert result.exit_code == 0, result.output
    assert [c["shape"] for c in json.loads(report.read_text())["checks"]] == [[1, 5]]


def test_check_without_artifacts_exits_1_and_a_malformed_shape_exits_2_each_with_one_line(artifacts):
    nothing = invoke(artifacts.checkpoint)
    assert nothing.exit_code == 1 and "pass at least one --onnx" in nothing.output
    result = invoke(artifacts.checkpoint, "--onnx", artifacts.tensorrt, "--shapes", "2x4")
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "expected B,T or B,T,P" in lines[0], result.output


def test_an_engine_without_manifest_is_refused(artifacts, tmp_path):
    engine = tmp_path / "x.engine"
    engine.write_bytes(b"")
    result = invoke(artifacts.checkpoint, "--engine", engine)
    assert result.exit_code == 1 and "no manifest x.engine.json" in result.output


def test_shapes_outside_the_exported_range_or_max_seq_len_are_one_line(artifacts):
    for shape, needle in (("9,3", "batch 9 is outside the range 1..3 tiny.tensorrt.onnx was exported for"),
                          ("1,99", "max_seq_len 16")):
        result = invoke(artifacts.checkpoint, "--onnx", artifacts.tensorrt, "--shapes", shape)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 1 and len(lines) == 1 and needle in lines[0], result.output
