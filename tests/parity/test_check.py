"""The one parity path (parity/check.py): the export's own check, ``attnres check`` and ``api.check`` agree; with-past
graphs are fed a past; a checkpoint paired with another model's file, or the wrong kind, is one line naming it."""

from __future__ import annotations

import json
import math

import onnx
import pytest
from typer.testing import CliRunner

from attnres_export import api
from attnres_export.cli import app
from attnres_export.dims import DimRange
from attnres_export.errors import ParityError
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.graphs.metadata import EXPORT_KEY, export_info
from attnres_export.graphs.onnx_utils import set_metadata
from attnres_export.models import save_checkpoint
from attnres_export.models.example import make_example
from attnres_export.models.registry import architecture

TINY = {"vocab_size": 32, "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "max_seq_len": 16}


def checkpoint(path, arch: str = "attnres-lm", **overrides):
    cfg = architecture(arch).config_type()(arch=arch, **{**TINY, **overrides})
    save_checkpoint(make_example(cfg, seed=1), cfg, path)
    return path


def one_line(*args) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, ["check", *map(str, args)])
    return result.exit_code, [line for line in result.output.splitlines() if line.strip()]


def without_recorded_config(source, target):
    """A copy of an export whose metadata records no model config (as files written before it was recorded)."""
    model = onnx.load(str(source))
    info = {k: v for k, v in export_info(model).items() if k not in ("config", "arch")}
    set_metadata(model, EXPORT_KEY, json.dumps(info))
    onnx.save(model, str(target))
    return target


@pytest.mark.slow
def test_the_exports_own_check_and_attnres_check_give_the_same_verdicts_and_errors(artifacts, tmp_path):
    out = tmp_path / "checked.onnx"
    exported = export_checkpoint(ExportOptions(artifacts.checkpoint, out, batch=DimRange(1, 2, 3),
                                               seq=DimRange(1, 4, 16), seed=7)).report
    checked = api.check(artifacts.checkpoint, onnx=[out], seed=7)
    assert exported.ok and checked.ok
    assert [c.shape for c in exported.checks] == [c.shape for c in checked.checks] == [[2, 4], [3, 1]]
    for ours, theirs in zip(exported.checks, checked.checks, strict=True):
        for name, m in ours.outputs.items():
            other = theirs.outputs[name]
            assert math.isclose(m.rel_l2, other.rel_l2, rel_tol=1e-9, abs_tol=1e-15)
            assert (m.rel_l2_bar, m.cosine_bar) == (other.rel_l2_bar, other.cosine_bar)


@pytest.mark.slow
def test_another_models_onnx_is_refused_in_one_line_naming_what_differs(artifacts, tmp_path):
    other = checkpoint(tmp_path / "other.pt", n_layers=2)
    code, lines = one_line(other, "--onnx", artifacts.tensorrt)
    assert code == 1 and len(lines) == 1, lines
    assert "tiny.tensorrt.onnx was exported from another model (n_layers 1; other.pt has n_layers 2)" in lines[0]


@pytest.mark.slow
def test_a_realformer_checkpoint_with_an_attnres_file_without_recorded_config_names_the_inputs(artifacts, tmp_path):
    stripped = without_recorded_config(artifacts.tensorrt, tmp_path / "old.onnx")
    realformer = checkpoint(tmp_path / "rf.pt", arch="realformer")
    code, lines = one_line(realformer, "--onnx", stripped)
    assert code == 1 and len(lines) == 1, lines
    assert ("old.onnx takes the inputs input_ids, but the graph of the realformer checkpoint rf.pt takes "
            "attention_mask, input_ids") in lines[0]


def test_another_vocabulary_is_refused_by_the_output_dims_when_no_config_is_recorded(artifacts, tmp_path):
    stripped = without_recorded_config(artifacts.tensorrt, tmp_path / "old.onnx")
    with pytest.raises(ParityError, match=r"old.onnx's output logits has dims \[.*, 32\], but v40.pt's model has "
                                          r"\[2, 4, 40\] there"):
        api.check(checkpoint(tmp_path / "v40.pt", vocab_size=40), onnx=[stripped])


@pytest.mark.slow
def test_a_with_past_graph_is_checked_on_a_prefill_and_a_decode_step_fed_a_real_past(past_artifacts, tmp_path):
    report = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["check", str(past_artifacts.checkpoint), "--onnx", str(past_artifacts.with_past),
                                      "--report", str(report)])
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["ok"] and data["with_past"] and data["shapes"] == "batch x seq x past"
    assert sorted({tuple(c["shape"]) for c in data["checks"]}) == [(2, 8, 0), (3, 1, 4)]
    assert set(data["checks"][0]["outputs"]) == {"logits", "present.0.key", "present.0.value"}


@pytest.mark.slow
def test_with_past_shapes_are_batch_tokens_past_and_stay_inside_the_ranges(past_artifacts):
    explicit = api.check(past_artifacts.checkpoint, onnx=[past_artifacts.with_past], shapes=[(1, 2, 3)])
    assert explicit.ok and [c.shape for c in explicit.checks] == [[1, 2, 3]]
    for shape, needle in (((2, 3), "is a with-past graph; give B,T,P"),
                          ((1, 1, 9), "past 9 is outside the range 0..8"),
                          ((1, 8, 9), r"T \+ P is over the model.s max_seq_len 16")):
        with pytest.raises(ParityError, match=needle):
            api.check(past_artifacts.checkpoint, onnx=[past_artifacts.with_past], shapes=[shape])


@pytest.mark.slow
def test_plain_and_with_past_files_in_one_check_are_refused_in_one_line(artifacts, past_artifacts):
    code, lines = one_line(artifacts.checkpoint, "--onnx", past_artifacts.with_past, "--onnx", artifacts.tensorrt)
    assert code == 1 and len(lines) == 1
    assert "tiny.with-past.tensorrt.onnx is a with-past graph and tiny.tensorrt.onnx is not" in lines[0]


def test_a_missing_artifact_is_one_line_before_the_checkpoint_is_loaded(artifacts, tmp_path):
    code, lines = one_line(artifacts.checkpoint, "--onnx", tmp_path / "absent.onnx")
    assert code == 1 and len(lines) == 1 and "--onnx" in lines[0] and "absent.onnx: no such file" in lines[0]
