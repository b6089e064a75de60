"""The ``onnxruntime`` target: a ``tensorrt`` with-past export converted to it computes the same prefill and decode
step with ONNX Runtime's fused ops in place of attention and norms, records what it wrote, and is refused by the
other targets (its ops' patterns are not recorded). Each family's export against transformers or the float64 model
is in the export's own check and the families' generate tests."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.errors import GraphError
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.graphs.onnx_utils import attnres_nodes
from attnres_export.graphs.onnxruntime_ops import OnnxRuntimeOps
from attnres_export.graphs.targets import PORTABLE_KEY, convert, detect_target
from attnres_export.models.base import PAST_PREFIX, PRESENT_PREFIX
from tests.cli.test_cli import invoke


@pytest.fixture(scope="module")
def with_past(block2_checkpoint, tmp_path_factory) -> onnx.ModelProto:
    out = tmp_path_factory.mktemp("ort-target") / "wp.onnx"
    export_checkpoint(ExportOptions(block2_checkpoint, out, with_past=True, check=False))
    return onnx.load(str(out))


def past_inputs(model: onnx.ModelProto, batch: int) -> dict[str, np.ndarray]:
    return {v.name: np.zeros([batch if d.dim_param == "batch" else 0 if d.dim_param == "past" else d.dim_value
                              for d in v.type.tensor_type.shape.dim], np.float32)
            for v in model.graph.input if v.name.startswith(PAST_PREFIX)}


def prefill_then_step(model: onnx.ModelProto, batch: int, seq: int) -> list[dict[str, np.ndarray]]:
    """Outputs of a prefill of ``seq`` tokens from an empty cache, then of one decode step on its presents."""
    ids = np.random.default_rng(batch * 31 + seq).integers(0, 97, size=(batch, seq + 1))
    with OnnxRuntimeRunner(model) as runner:
        first = runner.infer({"input_ids": ids[:, :seq], "attention_mask": np.ones((batch, seq), np.int64),
                              "position_ids": np.tile(np.arange(seq), (batch, 1)), **past_inputs(model, batch)})
        past = {name: first[PRESENT_PREFIX + name.removeprefix(PAST_PREFIX)] for name in past_inputs(model, batch)}
        second = runner.infer({"input_ids": ids[:, seq:], "attention_mask": np.ones((batch, seq + 1), np.int64),
                               "position_ids": np.full((batch, 1), seq), **past})
    return [first, second]


@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (1, 7), (3, 5)])
def test_onnxruntime_made_from_tensorrt_computes_the_same_prefill_and_decode_step(with_past, batch, seq):
    ort = convert(with_past, "onnxruntime")
    for expected, got in zip(prefill_then_step(with_past, batch, seq), prefill_then_step(ort, batch, seq),
                             strict=True):
        for name, value in expected.items():
            assert np.linalg.norm(got[name] - value) / np.linalg.norm(value) < 1e-5, name


def test_onnxruntime_target_writes_one_group_query_attention_per_layer_and_records_it(with_past):
    ort = convert(with_past, "onnxruntime")
    ops = OnnxRuntimeOps.of(ort)
    layers = sum(v.name.endswith(".key") for v in ort.graph.input if v.name.startswith(PAST_PREFIX))
    assert detect_target(ort) == "onnxruntime" and not attnres_nodes(ort.graph)
    assert ops.nodes["GroupQueryAttention"] == ops.attention_layers == layers == 2
    norms = ops.nodes["SimplifiedLayerNormalization"] + ops.nodes.get("SkipSimplifiedLayerNormalization", 0)
    assert norms >= 2 * layers
    assert [n.op_type for n in ort.graph.node if n.domain == "com.microsoft"].count("GroupQueryAttention") == layers
    assert PORTABLE_KEY in {p.key for p in ort.metadata_props}
    onnx.checker.check_model(ort, full_check=True)


def test_an_onnxruntime_graph_with_fused_ops_is_refused_by_the_other_targets_in_one_line(with_past):
    ort = convert(with_past, "onnxruntime")
    for target in ("tensorrt", "portable"):
        with pytest.raises(GraphError, match=f"GroupQueryAttention.*re-export the model with --target {target}"):
            convert(ort, target)


def test_attnres_convert_writes_the_onnxruntime_target_and_names_its_ops(exported_onnx, tmp_path):
    out = tmp_path / "m.ort.onnx"
    result = invoke("convert", exported_onnx, "--target", "onnxruntime", "-o", out)
    assert result.exit_code == 0, result.output
    assert detect_target(onnx.load(str(out))) == "onnxruntime"


@pytest.mark.slow
def test_a_decoder_graph_without_past_attends_through_group_query_attention_and_passes_its_check(tmp_path):
    folder = tmp_path / "llama"
    assert invoke("example", "--arch", "llama", folder).exit_code == 0
    report = tmp_path / "r.json"
    result = invoke("export", folder, "--target", "onnxruntime", "-o", tmp_path / "m.onnx", "--report", report)
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["ok"]
    ops = OnnxRuntimeOps.of(onnx.load(str(tmp_path / "m.onnx"), load_external_data=False))
    assert ops.nodes["GroupQueryAttention"] == 2 and ops.attention_layers == 0


@pytest.mark.slow
def test_heads_of_a_size_group_query_attention_refuses_keep_standard_attention_and_say_so(tmp_path):
    from tests.models.decoder.hf_bodies import hf_model, write_folder

    folder = tmp_path / "qwen3"
    write_folder(hf_model("qwen3", 3, head_dim=12), folder)
    result = invoke("export", folder, "--with-past", "--target", "onnxruntime", "-o", tmp_path / "m.onnx")
    assert result.exit_code == 0, result.output
    assert "heads of 12 values stay in standard ops" in " ".join(result.output.split())
    ops = OnnxRuntimeOps.of(onnx.load(str(tmp_path / "m.onnx"), load_external_data=False))
    assert "GroupQueryAttention" not in ops.nodes and ops.nodes["RotaryEmbedding"] == 2 * 3


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "dtype", "ops"), [
    ("qwen3-moe", "float16", {"MoE": 2, "GroupQueryAttention": 2, "RotaryEmbedding": 4}),
    ("kimi-linear", "bfloat16", {"LinearAttention": 1, "CausalConvWithState": 3}),
    pytest.param("deepseek-v3", "float16", {}, marks=pytest.mark.full),
])
def test_half_precision_with_past_exports_of_the_onnxruntime_target_pass_their_parity_check(tmp_path, arch, dtype,
                                                                                            ops):
    folder = tmp_path / arch
    assert invoke("example", "--arch", arch, folder).exit_code == 0
    report = tmp_path / "r.json"
    result = invoke("export", folder, "--with-past", "--target", "onnxruntime", "--dtype", dtype,
                    "-o", tmp_path / "m.onnx", "--report", report)
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["ok"]
    written = OnnxRuntimeOps.of(onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)).nodes
    assert {op: written.get(op) for op in ops} == ops
