"""A RealFormer checkpoint exports like any checkpoint: both targets, every dtype, parity, convert, CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from typer.testing import CliRunner

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.backends.pytorch.runner import TorchRunner
from attnres_export.cli import app
from attnres_export.dims import DimRange
from attnres_export.errors import CheckpointError
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.graphs.onnx_utils import attnres_nodes
from attnres_export.graphs.types import value_types
from attnres_export.models import load_checkpoint
from attnres_export.models.checkpoint import FORMAT, VERSION
from attnres_export.ops import RESIDUAL_ATTENTION
from attnres_export.ops.onnx_nodes import attribute
from tests.conftest import slow_after

ELEM = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16,
        "bfloat16": onnx.TensorProto.BFLOAT16}


def _export(checkpoint, out, **options):
    return export_checkpoint(ExportOptions(checkpoint, out, batch=DimRange(1, 2, 2), seq=DimRange(1, 8, 16),
                                           **options))


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "target"), slow_after([(d, t) for d in ("float32", "float16", "bfloat16")
                                                         for t in ("tensorrt", "portable")]))
def test_export_matches_pytorch_on_onnx_runtime(realformer_checkpoint, tmp_path, dtype, target) -> None:
    out = tmp_path / "rf.onnx"
    result = _export(realformer_checkpoint, out, target=target, dtype=dtype)
    assert result.report is not None and result.report.ok, result.report.to_dict()
    assert [c.shape for c in result.report.checks] == [[2, 8], [2, 1]]
    assert result.fused_nodes == result.expected_aggregations == 2
    assert result.fused_by_type == {RESIDUAL_ATTENTION: 2}
    model = onnx.load(str(out))
    assert [(i.name, i.type.tensor_type.elem_type) for i in model.graph.input] == \
        [("input_ids", onnx.TensorProto.INT64), ("attention_mask", onnx.TensorProto.INT64)]
    assert [d.dim_param for d in model.graph.input[1].type.tensor_type.shape.dim] == ["batch", "seq"]
    assert model.graph.output[0].name == "hidden"
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert {i.data_type for i in model.graph.initializer if i.name == "embed.tok.weight"} == {ELEM[dtype]}
    assert len(attnres_nodes(model.graph)) == (2 if target == "tensorrt" else 0)


@pytest.fixture(scope="module")
def float16_export(realformer_checkpoint, tmp_path_factory) -> Path:
    """The float16 tensorrt-target export, made once for the tests that read it."""
    out = tmp_path_factory.mktemp("rf16") / "rf.tensorrt.onnx"
    _export(realformer_checkpoint, out, dtype="float16", check=False)
    return out


def test_tensorrt_export_chains_scores_and_writes_only_present_inputs_for_the_parser(float16_export) -> None:
    """TensorRT's parser hands plugins a null tensor for an empty input name, so the first layer's node lists
    q, k, v, mask_bias with has_prev_scores=0 instead of an empty prev_scores."""
    model = onnx.load(str(float16_export))
    first, second = attnres_nodes(model.graph)
    assert "" not in first.input and "" not in second.input
    assert (attribute(first, "has_prev_scores"), attribute(first, "has_mask")) == (0, 1)
    assert (attribute(second, "has_prev_scores"), attribute(second, "has_mask")) == (1, 1)
    assert len(first.input) == 4 and second.input[3] == first.output[1]
    assert first.input[3] == second.input[4]
    assert [attribute(n, "logit_divisor") for n in (first, second)] == [1.0, 2.0]
    assert attribute(first, "scale") == pytest.approx(8**-0.5)
    assert {attribute(first, "plugin_version"), attribute(first, "plugin_namespace")} == {b"1", b"attnres"}
    types = value_types(model)
    assert types[first.input[3]] == types[first.output[1]] == onnx.TensorProto.FLOAT
    assert types[first.input[0]] == types[first.output[0]] == onnx.TensorProto.FLOAT16


def test_attnres_convert_round_trips_portable_and_tensorrt(realformer_checkpoint, float16_export, tmp_path) -> None:
    fused = float16_export
    runner = CliRunner()
    steps = [(fused, "portable", tmp_path / "rf.portable.onnx"),
             (tmp_path / "rf.portable.onnx", "tensorrt", tmp_path / "rf.back.onnx"),
             (tmp_path / "rf.back.onnx", "ort-trt", tmp_path / "rf.ort-trt.onnx")]
    for source, target, out in steps:
        result = runner.invoke(app, ["convert", str(source), "--target", target, "-o", str(out)])
        assert result.exit_code == 0, result.output
    original, back = (onnx.load(str(p)) for p in (fused, tmp_path / "rf.back.onnx"))
    assert [onnx.helper.printable_node(n) for n in attnres_nodes(back.graph)] == \
        [onnx.helper.printable_node(n) for n in attnres_nodes(original.graph)]
    assert len(attnres_nodes(onnx.load(str(tmp_path / "rf.ort-trt.onnx")).graph, "trt.plugins")) == 2

    model, _ = load_checkpoint(realformer_checkpoint)
    feeds = model.random_inputs(2, 7, np.random.default_rng(0))
    expected = TorchRunner(model, ["hidden"]).infer(feeds)["hidden"]
    for path in (fused, tmp_path / "rf.portable.onnx", tmp_path / "rf.back.onnx"):
        with OnnxRuntimeRunner(path) as ort_runner:
            got = ort_runner.infer(feeds)["hidden"]
        assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 5e-3, path.name


def test_checkpoint_with_renamed_keys_is_refused(realformer_checkpoint, tmp_path) -> None:
    payload = torch.load(realformer_checkpoint, weights_only=True)
    assert payload["format"] == FORMAT and payload["version"] == VERSION
    state = payload["state_dict"]
    state["layers.0.attn.q.weight"] = state.pop("layers.0.attn.wq.weight")
    bad = tmp_path / "bad.pt"
    torch.save(payload, bad)
    with pytest.raises(CheckpointError, match=r"missing layers\.0\.attn\.wq\.weight.*unexpected layers\.0\.attn\.q"):
        load_checkpoint(bad)


def test_checkpoint_save_load_round_trip_keeps_weights_and_running_mean(realformer_checkpoint) -> None:
    model, cfg = load_checkpoint(realformer_checkpoint)
    assert cfg.arch == "realformer" and cfg.running_mean and cfg.eps == 1e-12
    stored = torch.load(realformer_checkpoint, weights_only=True)["state_dict"]
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, stored[key], rtol=0, atol=0)


def test_cli_example_writes_a_realformer_and_refuses_attnres_options(tmp_path) -> None:
    runner = CliRunner()
    out = tmp_path / "rf.pt"
    result = runner.invoke(app, ["example", str(out), "--arch", "realformer", "--running-mean", "--d-model", "32",
                                 "--layers", "1", "--max-seq-len", "16"])
    assert result.exit_code == 0, result.output
    _, cfg = load_checkpoint(out)
    assert (cfg.arch, cfg.running_mean, cfg.eps, cfg.n_layers) == ("realformer", True, 1e-12, 1)
    for bad in (["--arch", "realformer", "--block-size", "2"], ["--arch", "realformer", "--residual", "standard"],
                ["--running-mean"]):
        result = runner.invoke(app, ["example", str(tmp_path / "bad.pt"), *bad])
        assert result.exit_code == 1 and not (tmp_path / "bad.pt").exists(), result.output


def test_fuse_norm_on_a_realformer_checkpoint_is_one_line_error(realformer_checkpoint, tmp_path) -> None:
    out = tmp_path / "r.onnx"
    result = CliRunner().invoke(app, ["export", str(realformer_checkpoint), "-o", str(out), "--fuse-norm"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "realformer model has no depth aggregations" in lines[0] and not out.exists()
