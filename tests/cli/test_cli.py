"""The command line: the quickstart path works, and bad input gives one clear line, exit 1, no output file."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import attnres_export.graphs.onnx_utils as onnx_utils
import attnres_export.graphs.save as save_module
from attnres_export.cli import app, export_app

runner = CliRunner()


def invoke(*args: str, application=app):
    return runner.invoke(application, [str(a) for a in args])


def assert_one_line_error(result, pattern: str) -> None:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    assert pattern in lines[0], lines[0]


def test_example_export_inspect_and_convert_work_end_to_end(tmp_path):
    ckpt, out = tmp_path / "ex.pt", tmp_path / "ex.onnx"
    assert invoke("example", ckpt, "--block-size", "2", "--d-model", "32", "--d-ff", "48").exit_code == 0
    result = invoke("export", ckpt, "-o", out, "--report", tmp_path / "r.json", "--seq", "1:4:8")
    assert result.exit_code == 0, result.output
    assert "Parity against the PyTorch model run in float64" in result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] and report["target"] == "tensorrt" and report["dtype"] == "float32"
    assert report["fused_nodes"] == 5 and report["checks"][0]["backend"] == "onnxruntime+ref-ops"
    inspected = invoke("inspect", out)
    assert inspected.exit_code == 0 and "AttnResAggregate" in inspected.output and "batch x seq" in inspected.output
    assert "parameters" in invoke("inspect", ckpt).output
    converted = invoke("convert", out, "--target", "portable", "-o", tmp_path / "p.onnx")
    assert converted.exit_code == 0, converted.output
    assert not [n for n in onnx.load(str(tmp_path / "p.onnx")).graph.node if n.domain]


@pytest.mark.slow
def test_attnres_export_entry_point_takes_the_same_options(block2_checkpoint, tmp_path):
    result = invoke(block2_checkpoint, "-o", tmp_path / "m.onnx", "--no-check", "--dtype", "float16",
                    application=export_app)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "m.onnx").is_file()


@pytest.mark.slow
def test_failed_parity_bar_exits_nonzero(block2_checkpoint, tmp_path):
    """A with-past graph is judged at the fixed bar against float32 PyTorch (a plain graph's bar would widen to
    PyTorch's own bfloat16 error, docs/parity.md#pass-bars), so a bar of 1e-9 cannot be met."""
    result = invoke("export", block2_checkpoint, "-o", tmp_path / "m.onnx", "--dtype", "bfloat16", "--with-past",
                    "--tol", "bfloat16:1e-9:0.9999999999", "--seq", "1:4:8")
    assert result.exit_code == 1
    assert "parity check failed" in result.output


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["--seq", "1:8:4096"], "exceeds the model's max_seq_len 64"),
        (["--past", "0:4:8"], "--past needs --with-past"),
    ],
)
def test_bad_export_option_is_one_clear_line_and_writes_nothing(block2_checkpoint, tmp_path, args, pattern):
    out = tmp_path / "m.onnx"
    assert_one_line_error(invoke("export", block2_checkpoint, "-o", out, *args), pattern)
    assert list(tmp_path.iterdir()) == []


def bad_checkpoints(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    torch.save(nn.Linear(2, 2), tmp_path / "module.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    torch.save({"format": "other"}, tmp_path / "format.pt")
    return {
        "pickled module": (tmp_path / "module.pt", "holds a pickled Python object"),
        "corrupted": (tmp_path / "junk.pt", "not a PyTorch checkpoint"),
        "wrong format": (tmp_path / "format.pt", "format is 'other'"),
        "missing": (tmp_path / "absent.pt", "MODEL " + str(tmp_path / "absent.pt") + ": no such file"),
    }


@pytest.mark.parametrize("case", ["pickled module", "corrupted", "wrong format", "missing"])
def test_bad_checkpoint_is_one_clear_line_and_writes_nothing(tmp_path, case):
    path, pattern = bad_checkpoints(tmp_path)[case]
    out_dir = tmp_path / "out"
    assert_one_line_error(invoke("export", path, "-o", out_dir / "m.onnx"), pattern)
    assert not out_dir.exists() or list(out_dir.iterdir()) == []


def test_debug_flag_shows_the_traceback(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"junk")
    result = invoke("--debug", "export", tmp_path / "junk.pt")
    assert result.exit_code != 0
    assert result.exception is not None


@pytest.mark.slow
def test_interrupted_write_leaves_no_model_and_no_temporary_file(block2_checkpoint, tmp_path, monkeypatch):
    real_save = onnx.save_model

    def save_then_interrupt(model, path, *args, **kwargs):
        real_save(model, path, *args, **kwargs)
        Path(path).write_bytes(Path(path).read_bytes()[:1000])
        raise KeyboardInterrupt

    monkeypatch.setattr(save_module.onnx, "save_model", save_then_interrupt)
    result = invoke("export", block2_checkpoint, "-o", tmp_path / "m.onnx", "--no-check")
    assert result.exit_code == 130
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_existing_output_survives_a_failed_rewrite(block2_checkpoint, tmp_path, monkeypatch):
    out = tmp_path / "m.onnx"
    assert invoke("export", block2_checkpoint, "-o", out, "--no-check").exit_code == 0
    before = out.read_bytes()
    monkeypatch.setattr(save_module.onnx, "save_model", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    result = invoke("export", block2_checkpoint, "-o", out, "--no-check")
    assert result.exit_code == 1 and "disk full" in result.output
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.slow
def test_models_over_the_protobuf_limit_are_saved_with_external_data_and_checked_from_it(block2_checkpoint, tmp_path,
                                                                                         monkeypatch):
    monkeypatch.setattr(onnx_utils, "PROTOBUF_LIMIT", 10_000)
    monkeypatch.setattr(onnx_utils, "EXTERNAL_DATA_MARGIN", 0)
    out = tmp_path / "big.onnx"
    result = invoke("export", block2_checkpoint, "-o", out, "--seq", "1:4:8")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "big.onnx.data").is_file()
    model = onnx.load(str(out), load_external_data=False)
    assert any(i.data_location == onnx.TensorProto.EXTERNAL for i in model.graph.initializer)
    checked = invoke("check", block2_checkpoint, "--onnx", out, "--shapes", "2,3")
    assert checked.exit_code == 0, checked.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "big.onnx.data"]
