"""``--quantize int4|int8``: float matmul weights quantized on export and kept quantized in the graph, judged against
the quantized model itself with the distance to the float model as information; the weights it picks; the TensorRT
quantization rules; ``attnres inspect``'s storage tables; the option's one-line refusals."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from attnres_export.backends.tensorrt.preflight import preflight
from attnres_export.exporter.quantized_graph import _stored_values
from attnres_export.graphs.tensorrt_quantization import dequantize_problem
from attnres_export.models.base import matmul_weight_names
from attnres_export.models.kimi.k3_example import write_k3_example_folder
from attnres_export.models.store import open_checkpoint
from tests.cli.test_cli import assert_one_line_error, invoke
from tests.models.decoder.hf_bodies import hf_model, write_folder

SIZES = {"hidden_size": 64, "intermediate_size": 96}


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return write_folder(hf_model("llama", 3, **SIZES), tmp_path_factory.mktemp("llama") / "llama")


def initializer_types(path) -> dict[str, int]:
    model = onnx.load(str(path), load_external_data=False)
    return {t.name: t.data_type for t in model.graph.initializer}


@pytest.mark.parametrize(("bits", "stored"), [("int4", TensorProto.INT4),
                                             pytest.param("int8", TensorProto.INT8, marks=pytest.mark.slow)])
def test_quantize_on_export_keeps_the_weights_quantized_and_passes_against_the_quantized_model(
        llama_folder, tmp_path, bits, stored):
    out, report = tmp_path / "q.onnx", tmp_path / "r.json"
    result = invoke("export", llama_folder, "--target", "portable", "-o", out, "--quantize", bits, "--report", report)
    assert result.exit_code == 0, result.output
    assert f"kept 21 weights quantized (21 {bits}-rtn)" in result.output
    assert "Quantized vs unquantized model" in result.output
    types = initializer_types(out)
    assert sum(t == stored for t in types.values()) == 21  # 3 layers x 7 projections; the head stays float
    assert types["model.embed_tokens.weight"] == TensorProto.FLOAT
    written = json.loads(report.read_text())
    rows = written["quantization"]
    assert [row["shape"] for row in rows] == ["1x64", "8x1"]
    assert all(0 < row["rel_l2"] < 1 and 0 <= row["top1"] <= 1 for row in rows)
    assert all(check["ok"] for check in written["checks"])


@pytest.mark.slow
def test_quantize_embeddings_quantizes_the_table_and_the_head_and_gathers_rows_before_dequantizing(
        llama_folder, tmp_path):
    out = tmp_path / "q.onnx"
    result = invoke("export", llama_folder, "--target", "portable", "-o", out, "--quantize", "int4",
                    "--quantize-embeddings", "--quantize-block-size", "16")
    assert result.exit_code == 0, result.output
    assert "kept 23 weights quantized" in result.output
    model = onnx.load(str(out), load_external_data=False)
    gathers = [n for n in model.graph.node if n.op_type == "Gather" and "embed_tokens.weight" in n.input[0]]
    assert {n.input[0] for n in gathers} == {"model.embed_tokens.weight.values",
                                              "model.embed_tokens.weight.scales"}
    types = {t.name: t.data_type for t in model.graph.initializer}
    assert types["model.embed_tokens.weight.values"] == TensorProto.INT8  # Gather takes no INT4
    assert {n.attribute[1].i for n in model.graph.node if n.op_type == "DequantizeLinear"} == {16}


def test_matmul_weights_are_linear_and_expert_weights_never_routers_norms_or_attnres_queries(tmp_path):
    folder, _, _ = write_k3_example_folder(tmp_path / "k3", seed=0, attn_res_block_size=2, layers=3)
    model = open_checkpoint(folder).streamed_model("float32").module
    names = matmul_weight_names(model, embeddings=False)
    assert "model.layers.1.mlp.experts.gate_up_proj" in names and "model.layers.1.mlp.experts.down_proj" in names
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert not [n for n in names if "mlp.gate.weight" in n or "norm" in n or "res_proj" in n or "conv1d" in n]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" not in names
    with_tables = matmul_weight_names(model, embeddings=True)
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= set(with_tables)


@pytest.mark.parametrize("values", [np.array([-8, 7, 0, -1, 3], dtype=np.int8), np.arange(-8, 8, dtype=np.int8)])
def test_int4_values_are_written_two_to_a_byte_low_nibble_first_as_onnx_reads_them(values):
    packed = _stored_values(torch.from_numpy(values), ir.DataType.INT4, "test")
    tensor = onnx.TensorProto(name="v", data_type=TensorProto.INT4, dims=[len(values)],
                              raw_data=packed.numpy().tobytes())
    assert np.array_equal(numpy_helper.to_array(tensor).astype(np.int8), values)


@pytest.mark.parametrize(("values", "input_rank", "scale_rank", "zero_points", "problem"), [
    ("int4", 2, 2, False, None),
    ("int8", 2, 1, False, None),
    ("float8e4m3fn", 2, 0, False, None),
    ("int8", 2, 2, False, "INT4 only"),
    ("float8e4m3fn", 3, 3, False, "INT4 only"),
    ("int4", 2, 2, True, "symmetric"),
    ("uint8", 2, 1, False, "not a TensorRT quantized type"),
])
def test_tensorrt_builds_int4_blocks_and_per_channel_int8_fp8_only_without_zero_points(
        values, input_rank, scale_rank, zero_points, problem):
    found = dequantize_problem(values, input_rank, scale_rank, zero_points)
    assert (found is None) if problem is None else (problem in found)


def test_preflight_refuses_an_int8_blocked_weight_before_tensorrt_parses_it():
    values = numpy_helper.from_array(np.ones((64, 8), dtype=np.int8), "w.values")
    scales = numpy_helper.from_array(np.ones((2, 8), dtype=np.float32), "w.scales")
    nodes = [helper.make_node("DequantizeLinear", ["w.values", "w.scales"], ["w"], axis=0, block_size=32,
                              name="w/DequantizeLinear"),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [values, scales])
    result = preflight(helper.make_model(graph), [], (10, 8))
    assert not result.ok
    assert result.lines() == ["error: node 'w/DequantizeLinear': TensorRT does not build this quantized weight's "
                              "DequantizeLinear: int8 values in blocks: TensorRT's blocked dequantization is INT4 only "
                              "(docs/quantization.md#tensorrt)"]


@pytest.mark.slow
def test_the_tensorrt_target_says_which_quantized_weights_tensorrt_will_not_build(tmp_path):
    folder, _, _ = write_k3_example_folder(tmp_path / "k3", seed=0, attn_res_block_size=None, layers=2)
    result = invoke("export", folder, "-o", tmp_path / "k3.onnx", "--no-check")
    assert result.exit_code == 0, result.output
    assert ("TensorRT does not build 2 of these weights (int8 values in blocks: TensorRT's blocked dequantization "
            "is INT4 only)") in " ".join(result.output.split())


@pytest.mark.slow
def test_inspect_lists_storage_formats_of_a_checkpoint_and_stored_types_of_an_onnx(tmp_path, llama_folder):
    folder, _, _ = write_k3_example_folder(tmp_path / "k3", seed=0, attn_res_block_size=None, layers=2)
    shown = invoke("inspect", folder)
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if line.startswith("mxfp4-pack-quantized"))
    assert row.split()[-1] == "0.531"  # half a byte per value and one scale byte per 32
    listed = invoke("inspect", folder, "--tensors")
    assert listed.exit_code == 0, listed.output
    experts = next(line for line in listed.output.splitlines() if "mlp.experts.down_proj" in line).split()
    assert experts[-2:] == ["mxfp4-pack-quantized", "0.531"]
    out = tmp_path / "q.onnx"
    assert invoke("export", llama_folder, "--target", "portable", "-o", out, "--quantize", "int4",
                  "--no-check").exit_code == 0
    shown = invoke("inspect", out)
    assert shown.exit_code == 0, shown.output
    assert next(line for line in shown.output.splitlines() if line.startswith("int4")).split()[-1] == "0.5"


@pytest.mark.parametrize(("args", "message"), [
    (["--quantize", "int3"], "--quantize 'int3': choose one of int4, int8"),
    (["--quantize", "int4", "--quantize-block-size", "24"], "--quantize-block-size 24: choose one of 16, 32"),
    (["--quantize-embeddings"], "--quantize-block-size and --quantize-embeddings need --quantize int4|int8"),
])
def test_quantize_options_are_refused_in_one_line(llama_folder, tmp_path, args, message):
    assert_one_line_error(invoke("export", llama_folder, "-o", tmp_path / "q.onnx", *args), message)


@pytest.mark.slow
def test_quantize_refuses_a_model_written_elsewhere(tmp_path, llama_folder):
    plain = tmp_path / "plain.onnx"
    assert invoke("export", llama_folder, "--target", "portable", "-o", plain, "--no-check").exit_code == 0
    assert_one_line_error(invoke("export", plain, "-o", tmp_path / "q.onnx", "--quantize", "int4"),
                          "--quantize: only checkpoints")


@pytest.mark.slow
def test_attnres_check_quantizes_the_checkpoint_as_the_export_recorded(llama_folder, tmp_path):
    out = tmp_path / "q.onnx"
    assert invoke("export", llama_folder, "--target", "portable", "-o", out, "--quantize", "int8",
                  "--quantize-block-size", "16", "--no-check").exit_code == 0
    checked = invoke("check", llama_folder, "--onnx", out)
    assert checked.exit_code == 0, checked.output


@pytest.mark.slow
def test_int8_for_the_tensorrt_target_is_per_channel_which_tensorrt_builds(llama_folder, tmp_path):
    out = tmp_path / "q.onnx"
    result = invoke("export", llama_folder, "-o", out, "--quantize", "int8")
    assert result.exit_code == 0, result.output
    assert "TensorRT does not build" not in result.output
    model = onnx.load(str(out), load_external_data=False)
    scales = {t.name: len(t.dims) for t in model.graph.initializer if t.name.endswith(".scales")}
    assert len(scales) == 21 and set(scales.values()) == {1}
    assert not [n for n in model.graph.node if n.op_type == "DequantizeLinear"
                and any(a.name == "block_size" for a in n.attribute)]


@pytest.mark.slow
def test_an_int4_genai_folder_with_its_head_quantized_generates_the_quantized_models_greedy_tokens(tmp_path):
    from tests.exporter.genai_helpers import assert_genai_generates_as, int4_qwen3_genai_folder

    folder, out = int4_qwen3_genai_folder(tmp_path, "--quantize-embeddings")
    assert_genai_generates_as(out, open_checkpoint(folder).quantized_on_read(4, 32, embeddings=True).model())


def test_the_onnxruntime_target_counts_the_matmul_nbits_it_writes_among_its_fused_ops_and_inspect_shows_them(
        llama_folder, tmp_path):
    out = tmp_path / "q.onnx"
    result = invoke("export", llama_folder, "--target", "onnxruntime", "-o", out, "--quantize", "int4")
    assert result.exit_code == 0, result.output
    model = onnx.load(str(out), load_external_data=False)
    written = [n for n in model.graph.node if n.op_type == "MatMulNBits" and n.domain == "com.microsoft"]
    assert len(written) == 15  # 3 layers x 7 projections in 5 nodes (sibling_matmul_nbits); the head stays float
    assert "15 MatMulNBits" in result.output.split("ONNX Runtime fused ops:")[1].splitlines()[0]

    shown = invoke("inspect", out)
    assert shown.exit_code == 0, shown.output
    rows = shown.output.split("ONNX Runtime fused ops (com.microsoft)")[1]
    assert ["MatMulNBits", "15"] in [line.split() for line in rows.splitlines()], rows


def test_the_with_past_onnxruntime_target_feeds_each_attention_its_stacked_query_key_value_projection(
        llama_folder, tmp_path):
    out = tmp_path / "q.onnx"
    result = invoke("export", llama_folder, "--target", "onnxruntime", "--with-past", "-o", out, "--quantize", "int4")
    assert result.exit_code == 0, result.output
    model = onnx.load(str(out), load_external_data=False)
    producers = {o: n for n in model.graph.node for o in n.output}
    attention = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attention) == 3 and all(list(n.input[1:3]) == ["", ""] for n in attention)
    stacked = [producers[n.input[0]] for n in attention]
    assert all(n.op_type == "MatMulNBits" and {a.name: a.i for a in n.attribute}["N"] == 128 for n in stacked)
