"""Malformed attnres nodes are refused with one line naming the node and the problem, by every command that reads
an ONNX, before ONNX Runtime (which would abort the process) or a graph transform sees them."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh
from typer.testing import CliRunner

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.cli import app
from attnres_export.errors import OpSetError
from attnres_export.graphs.load import load_onnx
from attnres_export.graphs.validate import attnres_node_problems

D = 4


def aggregate_model(n_sources: int = 2, eps: float | None = 1e-6, weight_len: int = D,
                    with_weight: bool = True, op_type: str = "AttnResAggregate") -> onnx.ModelProto:
    """``y = AttnResAggregate(sw, x, x, ...)`` with declared shapes, bent as the arguments say."""
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, D])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, D])
    weight = numpy_helper.from_array(np.ones(weight_len, np.float32), "sw")
    attrs = {} if eps is None else {"eps": eps}
    inputs = (["sw"] if with_weight else []) + ["x"] * n_sources
    node = oh.make_node(op_type, inputs, ["y"], name="agg", domain="attnres", **attrs,
                        plugin_version="1", plugin_namespace="attnres")
    graph = oh.make_graph([node], "g", [x], [y], initializer=[weight])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("attnres", 1)])


def aggregate_norm_model(outputs: tuple[str, ...] = ("y",), norm_len: int = D, **attrs) -> onnx.ModelProto:
    """``y[, h] = AttnResAggregateNorm(sw, nw, x, x)`` with declared shapes, bent as the arguments say."""
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, D])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, D])
    weights = [numpy_helper.from_array(np.ones(D, np.float32), "sw"),
               numpy_helper.from_array(np.ones(norm_len, np.float32), "nw")]
    node = oh.make_node("AttnResAggregateNorm", ["sw", "nw", "x", "x"], list(outputs), name="agg",
                        domain="attnres", **({"eps": 1e-6, "norm_eps": 1e-5} | attrs))
    graph = oh.make_graph([node], "g", [x], [y], initializer=weights)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("attnres", 1)])


def attention_model(inputs: list[str], **attrs) -> onnx.ModelProto:
    values = [oh.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 3, 4]) for n in ("q", "k", "v")]
    out = oh.make_tensor_value_info("out", TensorProto.FLOAT, [1, 2, 3, 4])
    node = oh.make_node("ResidualScoreAttention", inputs, ["out", "scores"], name="rsa", domain="attnres",
                        **({"scale": 0.5, "logit_divisor": 1.0} | attrs))
    graph = oh.make_graph([node], "g", values, [out])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("attnres", 1)])


BAD_MODELS = {
    "eps-missing": (lambda: aggregate_model(eps=None), "missing attribute eps"),
    "eps-negative": (lambda: aggregate_model(eps=-1.0), "attribute eps is -1.0; it must be a finite number >= 0"),
    "eps-nan": (lambda: aggregate_model(eps=math.nan), "attribute eps is nan"),
    "eps-inf": (lambda: aggregate_model(eps=math.inf), "attribute eps is inf"),
    "no-sources": (lambda: aggregate_model(n_sources=0), "has 0 sources; takes 1..256"),
    "257-sources": (lambda: aggregate_model(n_sources=257), "has 257 sources; takes 1..256"),
    "no-score-weight": (lambda: aggregate_model(n_sources=0, with_weight=False), "missing input score_weight"),
    "weight-length": (lambda: aggregate_model(weight_len=3),
                      "score_weight has length 3 but the sources' last dim is 4"),
    "missing-v": (lambda: attention_model(["q", "k"]), "missing input v"),
    "empty-q": (lambda: attention_model(["", "k", "v"]), "missing input q"),
    "divisor-zero": (lambda: attention_model(["q", "k", "v"], logit_divisor=0.0), "attribute logit_divisor is 0.0"),
    "compact-count": (lambda: attention_model(["q", "k", "v"], has_prev_scores=1, has_mask=0),
                      "presence attributes (has_prev_scores, has_mask) say 4"),
    "unknown-op": (lambda: aggregate_model(op_type="AttnResMystery"), "the attnres op set has no op 'AttnResMystery'"),
    "norm-eps-negative": (lambda: aggregate_norm_model(norm_eps=-0.5), "attribute norm_eps is -0.5"),
    "norm-weight-length": (lambda: aggregate_norm_model(norm_len=3),
                           "norm_weight has length 3 but the sources' last dim is 4"),
    "three-outputs": (lambda: aggregate_norm_model(("y", "h", "z")), "has 3 outputs; has at most 2"),
    "no-y": (lambda: aggregate_norm_model(("", "h")), "missing output y"),
    "compact-outputs": (lambda: aggregate_norm_model(("y",), has_aggregate=1),
                        "presence attributes (has_aggregate) say 2"),
}


@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_each_contract_violation_is_named_with_the_node(case: str) -> None:
    make, expected = BAD_MODELS[case]
    problems = attnres_node_problems(make())
    assert problems and expected in problems[0]
    assert "node 'agg'" in problems[0] or "node 'rsa'" in problems[0]


@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_loading_a_bad_file_is_one_opset_error(case: str, tmp_path: Path) -> None:
    make, expected = BAD_MODELS[case]
    path = tmp_path / f"{case}.onnx"
    onnx.save(make(), str(path))
    with pytest.raises(OpSetError, match=r"docs/op-set\.md") as error:
        load_onnx(path)
    assert expected in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("case", ["eps-negative", "no-sources", "weight-length", "missing-v"])
def test_onnx_runtime_never_sees_a_bad_node(case: str) -> None:
    with pytest.raises(OpSetError, match=re.escape(BAD_MODELS[case][1].split(";")[0])):
        OnnxRuntimeRunner(BAD_MODELS[case][0]())


@pytest.mark.parametrize("command", [
    ["inspect", "{f}"],
    ["convert", "{f}", "--target", "portable", "-o", "{out}"],
    ["fuse", "{f}", "-o", "{out}"],
    ["export", "{f}", "-o", "{out}"],
    ["bench", "{f}", "--iterations", "1", "--shapes", "1,1"],
])
def test_every_command_that_reads_onnx_refuses_a_bad_node_in_one_line(command: list[str], tmp_path: Path) -> None:
    path, out = tmp_path / "bad.onnx", tmp_path / "out.onnx"
    onnx.save(aggregate_model(n_sources=0), str(path))
    args = [a.format(f=path, out=out) for a in command]
    result = CliRunner().invoke(app, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and "has 0 sources" in lines[0] and "Traceback" not in result.output
    assert not out.exists()


def test_valid_nodes_of_both_ops_and_spellings_pass() -> None:
    assert attnres_node_problems(aggregate_model()) == []
    assert attnres_node_problems(aggregate_model(n_sources=256)) == []
    assert attnres_node_problems(attention_model(["q", "k", "v"])) == []
    assert attnres_node_problems(attention_model(["q", "k", "v", "", "m"])) == []
    assert attnres_node_problems(attention_model(["q", "k", "v", "m"], has_prev_scores=0, has_mask=1)) == []
    assert attnres_node_problems(aggregate_norm_model()) == []
    assert attnres_node_problems(aggregate_norm_model(("y", "h"))) == []
    assert attnres_node_problems(aggregate_norm_model(("y", "h"), has_aggregate=1)) == []


def test_empty_and_non_onnx_files_are_graph_errors(tmp_path: Path) -> None:
    empty, text = tmp_path / "empty.onnx", tmp_path / "text.onnx"
    empty.write_bytes(b"")
    text.write_text("not a model at all")
    for path in (empty, text):
        result = CliRunner().invoke(app, ["inspect", str(path)])
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert "not" in result.output and str(path.name) in result.output
