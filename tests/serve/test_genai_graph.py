"""An onnxruntime-genai folder's ``model.onnx`` (its attention is ``com.microsoft.GroupQueryAttention``, which reads
row lengths, not the mask) is refused by ``attnres triton-repo`` and ``attnres serve`` in one line that names the
node and the export to serve instead, before anything is written or started."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from attnres_export.cli import app
from attnres_export.graphs.metadata import EXPORT_KEY
from attnres_export.serve.dependencies import ServeError
from attnres_export.serve.server import ServeOptions, prepare_model
from tests.serve.conftest import NEEDS_CLIENT

runner = CliRunner()


@pytest.fixture
def genai_graph(tmp_path):
    """One GroupQueryAttention node as the --genai rewrite writes it (query, key, value, past, lengths)."""
    floats = {name: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in [
        ("query", ["batch", "seq", 32]), ("key", ["batch", "seq", 16]), ("value", ["batch", "seq", 16]),
        ("past_key_values.0.key", ["batch", 2, "past", 8]), ("past_key_values.0.value", ["batch", 2, "past", 8])]}
    ints = [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
            helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 32]),
               helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, ["batch", 2, "total", 8]),
               helper.make_tensor_value_info("present.0.value", TensorProto.FLOAT, ["batch", 2, "total", 8])]
    node = helper.make_node("GroupQueryAttention", [*floats, "seqlens_k", "total_sequence_length"],
                            ["logits", "present.0.key", "present.0.value"], domain="com.microsoft", num_heads=4,
                            kv_num_heads=2, name="genai/layer0/gqa")
    model = helper.make_model(helper.make_graph([node], "genai", [*floats.values(), *ints], outputs),
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    helper.set_model_props(model, {EXPORT_KEY: json.dumps({"target": "portable", "with_past": True})})
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    return path


@NEEDS_CLIENT
def test_triton_repo_refuses_an_onnxruntime_genai_graph_in_one_line_and_writes_nothing(genai_graph, tmp_path):
    result = runner.invoke(app, ["triton-repo", str(genai_graph), "-o", str(tmp_path / "repo")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert ("1 com.microsoft.GroupQueryAttention node(s) (the onnxruntime target's or an onnxruntime-genai "
            "folder's graph)") in lines[0]
    assert "attnres-export MODEL --with-past --target portable" in lines[0]
    assert not (tmp_path / "repo").exists()


def test_serve_refuses_an_onnxruntime_genai_graph_before_any_runner_exists(genai_graph):
    with pytest.raises(ServeError, match="read each row's length, not its attention mask"):
        prepare_model(ServeOptions(genai_graph))
