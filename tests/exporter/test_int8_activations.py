"""``--int8-activations``: quantized weights written as ``MatMulNBits`` at ``accuracy_level`` 4 (ONNX Runtime
quantizes the activations to int8), judged at the float32 bars against a reference that quantizes the same
activations (``parity/int8_activations.py``); the same file misses them against the float-activation model; the
option's one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from attnres_export.graphs.metadata import INT8_ACTIVATIONS_KEY, export_info
from attnres_export.models.store import open_checkpoint
from attnres_export.parity.metrics import tolerance_for
from attnres_export.parity.session import check_onnx
from tests.cli.test_cli import assert_one_line_error, invoke
from tests.models.decoder.hf_bodies import hf_model, write_folder

SIZES = {"hidden_size": 64, "intermediate_size": 96}
PROJECTIONS = 21
"""3 layers x 7 projections (the head stays float)."""
NODES = 15
"""Their MatMulNBits, 5 a layer: query/key/value stacked (sibling_matmul_nbits), output, gate, up, down."""


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    return write_folder(hf_model("llama", 3, **SIZES), tmp_path_factory.mktemp("llama") / "llama")


def matmul_nbits_levels(path: Path) -> list[int]:
    model = onnx.load(str(path), load_external_data=False)
    return [next(a.i for a in node.attribute if a.name == "accuracy_level")
            for node in model.graph.node if node.op_type == "MatMulNBits"]


def test_int8_activations_write_accuracy_level_4_and_pass_against_the_reference_that_quantizes_them_too(
        llama_folder, tmp_path):
    out = tmp_path / "a8.onnx"
    result = invoke("export", llama_folder, "--target", "onnxruntime", "-o", out, "--quantize", "int4",
                    "--int8-activations")
    assert result.exit_code == 0, result.output
    assert "onnxruntime+artifact-rounding" in result.output
    assert matmul_nbits_levels(out) == [4] * NODES
    blocks = export_info(onnx.load(str(out), load_external_data=False))[INT8_ACTIVATIONS_KEY]
    assert len(blocks) == PROJECTIONS and {entry["block"] for entry in blocks.values()} == {32}
    assert "model.layers.2.mlp.down_proj.weight" in blocks

    checked = invoke("check", llama_folder, "--onnx", out)
    assert checked.exit_code == 0, checked.output

    quantized = open_checkpoint(llama_folder).quantized_on_read(4, 32, embeddings=False)
    float_activations = check_onnx(out, out.name, lambda: quantized.model(None), False, "float32", 0, [(1, 64), (8, 1)],
                                   tolerance_for("float32", {}))
    assert not float_activations.ok


def test_without_the_option_matmul_nbits_keeps_float32_activations(llama_folder, tmp_path):
    out = tmp_path / "a1.onnx"
    result = invoke("export", llama_folder, "--target", "onnxruntime", "-o", out, "--quantize", "int4", "--no-check")
    assert result.exit_code == 0, result.output
    assert matmul_nbits_levels(out) == [1] * NODES
    assert INT8_ACTIVATIONS_KEY not in export_info(onnx.load(str(out), load_external_data=False))


@pytest.mark.parametrize(("options", "message"), [
    (["--target", "portable", "--quantize", "int4"], "--int8-activations: the portable target writes no MatMulNBits"),
    (["--target", "tensorrt", "--quantize", "int4"], "--int8-activations: the tensorrt target writes no MatMulNBits"),
    (["--target", "onnxruntime", "--quantize", "int4", "--dtype", "float16"],
     "--int8-activations: --dtype float16: ONNX Runtime's CPU MatMulNBits quantizes float32"),
    (["--target", "onnxruntime"], "--int8-activations: llama has no quantized weights"),
])
def test_int8_activations_are_refused_in_one_line_where_no_matmul_nbits_would_take_them(
        llama_folder, tmp_path, options, message):
    result = invoke("export", llama_folder, "-o", tmp_path / "x.onnx", "--int8-activations", *options)
    assert_one_line_error(result, message)
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.slow
def test_an_int8_activation_genai_folder_generates_the_tokens_of_the_model_that_quantizes_its_activations(tmp_path):
    from attnres_export.parity.int8_activations import with_int8_activations
    from tests.exporter.genai_helpers import assert_genai_generates_as, int4_qwen3_genai_folder

    folder, out = int4_qwen3_genai_folder(tmp_path, "--int8-activations")
    assert set(matmul_nbits_levels(out / "model.onnx")) == {4}
    blocks = export_info(onnx.load(str(out / "model.onnx"), load_external_data=False))[INT8_ACTIVATIONS_KEY]
    model = with_int8_activations(open_checkpoint(folder).quantized_on_read(4, 32, embeddings=False).model(), blocks)
    assert_genai_generates_as(out, model)


@pytest.mark.slow
def test_latent_attention_with_past_passes_with_int8_activations_its_kv_b_projection_kept_float_activations(tmp_path):
    folder = write_folder(hf_model("deepseek_v3", 3, **SIZES), tmp_path / "deepseek")
    out = tmp_path / "a8.with-past.onnx"
    result = invoke("export", folder, "--with-past", "--target", "onnxruntime", "-o", out, "--quantize", "int4",
                    "--int8-activations")
    assert result.exit_code == 0, result.output
    blocks = export_info(onnx.load(str(out), load_external_data=False))[INT8_ACTIVATIONS_KEY]
    assert len(blocks) == PROJECTIONS and not [name for name in blocks if "kv_b_proj" in name]


@pytest.mark.slow
def test_a_deeper_model_whose_activations_round_at_ties_passes_with_only_those_roundings_taken_from_the_graph(
        tmp_path):
    folder = write_folder(hf_model("llama", 8, hidden_size=256, intermediate_size=512), tmp_path / "llama8")
    out, report = tmp_path / "a8.onnx", tmp_path / "report.json"
    result = invoke("export", folder, "--target", "onnxruntime", "-o", out, "--quantize", "int4",
                    "--quantize-embeddings", "--int8-activations", "--report", report)
    assert result.exit_code == 0, result.output
    roundings = json.loads(report.read_text())["rounding_aware"]["roundings"]
    assert sum(shape["taken_at_ties"] for shape in roundings) > 0
    assert all(shape["differ_without_tie"] == 0 for shape in roundings)
