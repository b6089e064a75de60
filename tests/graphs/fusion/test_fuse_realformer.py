"""Pattern fusion of RealFormers written elsewhere: every attention layer with residual scores becomes one
ResidualScoreAttention node chained through its ``scores``; plain attention and near misses are left alone."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import json
import math
import warnings

import numpy as np
import onnx
import pytest
import torch
from typer.testing import CliRunner

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.cli import app
from attnres_export.graphs.fusion import FusionResult, random_feeds
from attnres_export.graphs.fusion.classify import ATTENTION
from attnres_export.graphs.fusion.context import FusionContext
from attnres_export.graphs.fusion.residual.pattern import RESIDUAL, ResidualScorePattern
from attnres_export.graphs.fusion.residual.verify import verify_attention
from attnres_export.graphs.targets import convert
from attnres_export.graphs.types import value_types
from attnres_export.ops.descriptors import OPS
from attnres_export.ops.opset import DOMAIN, RESIDUAL_ATTENTION
from attnres_export.parity.fusion_checks import fuse_and_check, onnxruntime_numerics
from attnres_export.parity.metrics import compare, tolerance_for
from attnres_export.parity.report import Report
from tests.graphs.fusion.foreign_models import example_ids
from tests.graphs.fusion.foreign_realformer import (
    IMAGE,
    LAYERS,
    NEAR_MISS,
    RESIDUAL_STYLES,
    VIT_LAYERS,
    BertStyleRealFormer,
    BmmRealFormerViT,
    PlainBert,
    RunningMeanRealFormer,
    TokenMajorScoresRealFormer,
    TokenMajorScoresViT,
)
from tests.graphs.fusion.helpers import dynamic_shapes, fuse, matches_torch, plain_onnx, save_program

OPSET = {"bert-style": 18, "running-mean": 23, "einsum": 23}
"""The styles through both ends of the opset range (the optimizer writes GELU and LayerNorm differently)."""


def attention_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == RESIDUAL_ATTENTION and n.domain == DOMAIN]


def inputs_of(node: onnx.NodeProto) -> dict[str, str]:
    """Input name by formal input (``""`` for an absent one), whatever the spelling."""
    op = OPS[RESIDUAL_ATTENTION]
    return {spec.name: name for spec, name in zip(op.inputs, op.canonical_inputs(node), strict=True)}


def attr(node: onnx.NodeProto, name: str):
    return next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name)


def matches_torch_at(onnx_model: onnx.ModelProto, model: torch.nn.Module, dtype: str, batch: int = 3,
                     seq: int = 6) -> bool:
    """The ONNX model against the float32 PyTorch model, at the bar of ``dtype`` (docs/parity.md)."""
    ids = example_ids(batch, seq, seed=1)
    with torch.inference_mode():
        expected = model(ids).numpy()
    with OnnxRuntimeRunner(onnx_model) as runner:
        got = next(iter(runner.infer({"input_ids": ids.numpy()}).values()))
    return compare(np.asarray(got, np.float32), expected, tolerance_for(dtype)).ok


@pytest.fixture(scope="module")
def fused_styles() -> dict[str, tuple[FusionResult, Report]]:
    """Each residual style's plain export, fused once for the tests that only read the result."""
    return {style: fuse(plain_onnx(cls, opset=OPSET[style])) for style, cls in RESIDUAL_STYLES.items()}


@pytest.mark.slow
@pytest.mark.parametrize("style", sorted(RESIDUAL_STYLES))
def test_every_residual_score_layer_fuses_into_one_node_and_the_result_matches_torch(style, fused_styles):
    result, parity = fused_styles[style]
    residual = [s for s in result.sites if s.kind == RESIDUAL]
    assert [s.reason for s in residual] == [""] * LAYERS and all(s.fused for s in residual)
    assert len(attention_nodes(result.model)) == LAYERS and result.fused_by_op == {RESIDUAL_ATTENTION: LAYERS}
    assert not [n for n in result.model.graph.node if n.op_type == "Softmax"]
    assert parity.ok
    assert matches_torch(result.model, RESIDUAL_STYLES[style]().eval())


@pytest.mark.slow
@pytest.mark.parametrize("style", sorted(RESIDUAL_STYLES))
def test_the_first_layer_has_no_prev_scores_and_each_next_layer_reads_the_previous_scores_output(style,
                                                                                                   fused_styles):
    nodes = attention_nodes(fused_styles[style][0].model)
    assert inputs_of(nodes[0])["prev_scores"] == ""
    for before, after in itertools.pairwise(nodes):
        assert inputs_of(after)["prev_scores"] == before.output[1]
    assert all(OPS[RESIDUAL_ATTENTION].node_problems(n) == [] for n in nodes)


@pytest.mark.slow
def test_scale_divisor_and_mask_are_read_off_each_style(fused_styles):
    head_dim = BertStyleRealFormer().head_dim
    bert, mean, einsum = (attention_nodes(fused_styles[s][0].model) for s in ("bert-style", "running-mean", "einsum"))
    for nodes in (bert, mean):
        assert [attr(n, "scale") for n in nodes] == pytest.approx([1 / math.sqrt(head_dim)] * LAYERS, rel=1e-6)
    assert [attr(n, "scale") for n in einsum] == [1.0] * LAYERS
    assert [attr(n, "logit_divisor") for n in bert + einsum] == [1.0] * 2 * LAYERS
    assert [attr(n, "logit_divisor") for n in mean] == [1.0, 2.0, 3.0]
    for nodes in (bert, einsum):
        assert len({inputs_of(n)["mask_bias"] for n in nodes}) == 1 and inputs_of(nodes[0])["mask_bias"]
    assert [inputs_of(n)["mask_bias"] for n in mean] == [""] * LAYERS


def test_a_single_token_sequence_fuses_every_layer_and_matches_torch():
    original = plain_onnx(BertStyleRealFormer, opset=18)
    result, parity = fuse_and_check(original, random_feeds(original, 3, {"input_ids": [2, 1]}), seed=3)
    assert result.fused_by_op == {RESIDUAL_ATTENTION: LAYERS} and parity.ok
    assert matches_torch(result.model, BertStyleRealFormer().eval(), batch=2, seq=1)


@pytest.mark.slow
def test_float16_realformer_fuses_with_a_float32_running_sum_and_matches_torch_at_the_float16_bar():
    model = RunningMeanRealFormer().eval()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        half = torch.onnx.export(RunningMeanRealFormer().eval().half(), (example_ids(),), dynamo=True,
                                 dynamic_shapes=dynamic_shapes(), input_names=["input_ids"],
                                 output_names=["hidden"], opset_version=18).model_proto
    result, parity = fuse(half)
    nodes = attention_nodes(result.model)
    assert len(nodes) == result.fused_by_op[RESIDUAL_ATTENTION] == LAYERS and parity.ok
    types = value_types(result.model)
    assert {types[n.output[1]] for n in nodes} == {onnx.TensorProto.FLOAT}
    assert {types[inputs_of(n)["q"]] for n in nodes} == {onnx.TensorProto.FLOAT16}
    for before, after in itertools.pairwise(nodes):
        assert inputs_of(after)["prev_scores"] == before.output[1]
    assert matches_torch_at(result.model, model, "float16")


@pytest.mark.slow
def test_bfloat16_realformer_fuses_and_passes_whole_model_parity_at_the_bfloat16_bar():
    """The CPU runs bfloat16 through a float32 emulation, so the bar comes from the output's declared type."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        bf16 = torch.onnx.export(BertStyleRealFormer().eval().to(torch.bfloat16), (example_ids(),), dynamo=True,
                                 dynamic_shapes=dynamic_shapes(), input_names=["input_ids"],
                                 output_names=["hidden"], opset_version=18).model_proto
    result, parity = fuse(bf16)
    assert result.fused_by_op == {RESIDUAL_ATTENTION: LAYERS} and parity.ok, parity.to_dict()
    assert parity.checks[0].outputs["hidden"].rel_l2 > 1e-5
    assert {value_types(result.model)[inputs_of(n)["q"]] for n in attention_nodes(result.model)} == \
        {onnx.TensorProto.BFLOAT16}


@pytest.mark.slow
def test_plain_attention_gets_no_residual_node_and_its_softmaxes_stay_attention():
    original = plain_onnx(PlainBert, opset=18)
    result, parity = fuse(original)
    assert [s.kind for s in result.sites] == [ATTENTION] * LAYERS
    assert result.fused_by_op == {} and attention_nodes(result.model) == []
    assert len(result.model.graph.node) == len(original.graph.node) and parity.ok


@pytest.mark.slow
def test_attention_over_a_single_token_is_still_attention_and_not_an_unfused_depth_aggregation():
    """With one key the attention softmax weighs one tensor, like a one-source aggregation; its Q K^T logits
    and P V product of activations still say attention, so no depth site is reported unfused."""
    original = plain_onnx(PlainBert, opset=18)
    result, parity = fuse_and_check(original, random_feeds(original, 3, {"input_ids": [2, 1]}), seed=3)
    assert [s.kind for s in result.sites] == [ATTENTION] * LAYERS
    assert result.unfused == [] and parity.ok


@pytest.mark.slow
@pytest.mark.parametrize(("style", "reason", "first"), [
    ("scores-after-softmax", "after the softmax", ATTENTION),
    ("multiplied-scores", "through Mul, not added", ATTENTION),
    ("carried-mask", "a mask would accumulate", RESIDUAL),
])
def test_a_near_miss_is_rejected_with_its_reason_and_left_as_it_was(style, reason, first):
    """The first layer is plain attention unless a later layer adds its scores (then it is rejected too)."""
    original = plain_onnx(NEAR_MISS[style], opset=18)
    result, parity = fuse(original)
    rejected = [s for s in result.sites if s.kind == RESIDUAL]
    assert len(rejected) == LAYERS - (first == ATTENTION) and not any(s.fused for s in rejected)
    assert all(reason in s.reason for s in rejected), [s.reason for s in rejected]
    assert result.sites[0].kind == first
    assert attention_nodes(result.model) == [] and len(result.model.graph.node) == len(original.graph.node)
    assert parity.ok


@pytest.mark.slow
@pytest.mark.parametrize(("field", "factor"), [("scale", 1.01), ("divisor", 1.01)])
def test_verification_rejects_a_replacement_with_a_wrong_scale_or_divisor(field, factor):
    model = plain_onnx(RunningMeanRealFormer, opset=18)
    numerics = onnxruntime_numerics()
    context = FusionContext.build(model, random_feeds(model, 0), numerics, 0)
    pattern = ResidualScorePattern()
    last = pattern.replace(context, pattern.sites(context, context.softmaxes)[-1]).plan
    assert verify_attention(context.index, last, context.values, 0, numerics).ok
    wrong = dataclasses.replace(last, **{field: getattr(last, field) * factor})
    verdict = verify_attention(context.index, wrong, context.values, 0, numerics)
    assert not verdict.ok and "differs from ResidualScoreAttention" in verdict.reason


@pytest.mark.slow
def test_the_fused_model_converts_to_portable_and_back_computing_the_same(fused_styles):
    fused = fused_styles["bert-style"][0].model
    portable = convert(fused, "portable")
    assert attention_nodes(portable) == []
    assert matches_torch(portable, BertStyleRealFormer().eval())
    assert len(attention_nodes(convert(portable, "tensorrt"))) == LAYERS


def test_fuse_command_reports_residual_score_attention_and_writes_one_node_per_layer(tmp_path):
    source, out, report = tmp_path / "realformer.onnx", tmp_path / "fused.onnx", tmp_path / "fuse.json"
    onnx.save(plain_onnx(BertStyleRealFormer, opset=18), str(source))
    result = CliRunner().invoke(app, ["fuse", str(source), "-o", str(out), "--report", str(report),
                                      "--example-shape", "input_ids:2,1"])
    assert result.exit_code == 0, result.output
    assert f"{LAYERS} ResidualScoreAttention nodes" in " ".join(result.output.split())  # long paths wrap
    assert len(attention_nodes(onnx.load(str(out)))) == LAYERS
    data = json.loads(report.read_text())
    assert data["by_op"][RESIDUAL_ATTENTION] == {"kind": RESIDUAL, "found": LAYERS, "fused": LAYERS, "unfused": 0}
    assert data["fused_by_op"] == {RESIDUAL_ATTENTION: LAYERS}
    assert data["parity"]["ok"] and {s["kind"] for s in data["sites"]} == {RESIDUAL}


@pytest.mark.slow
def test_pt2_program_exports_with_one_residual_node_per_layer_checked_against_the_program(tmp_path):
    model = RunningMeanRealFormer().eval()
    program = save_program(model, tmp_path / "realformer.pt2")
    out, report = tmp_path / "realformer.onnx", tmp_path / "export.json"
    result = CliRunner().invoke(app, ["export", str(program), "-o", str(out), "--report", str(report)])
    assert result.exit_code == 0, result.output
    written = onnx.load(str(out))
    assert len(attention_nodes(written)) == LAYERS
    assert all(OPS[RESIDUAL_ATTENTION].is_compact(n) for n in attention_nodes(written))
    data = json.loads(report.read_text())
    assert data["ok"] and data["reference"] == "the PyTorch program"
    assert data["fusion"]["fused_by_op"] == {RESIDUAL_ATTENTION: LAYERS}
    assert data["fused_nodes"] == LAYERS
    assert f"{LAYERS} ResidualScoreAttention nodes fused" in " ".join(result.output.split())  # long paths wrap
    assert matches_torch(written, model)


@pytest.mark.slow
def test_rejected_residual_score_sites_warn_and_fail_with_strict(tmp_path):
    """A near miss (a mask carried with the scores) is a RealFormer layer left as standard ops: warned like an
    unfused depth aggregation, and an error under --strict that writes nothing."""
    source = tmp_path / "near_miss.onnx"
    onnx.save(plain_onnx(NEAR_MISS["carried-mask"], opset=18), str(source))
    runner = CliRunner()
    result = runner.invoke(app, ["fuse", str(source), "-o", str(tmp_path / "a.onnx")])
    assert result.exit_code == 0, result.output
    assert f"{LAYERS} residual-score attention site(s) were not fused, or only in part" in result.output
    strict = runner.invoke(app, ["fuse", str(source), "-o", str(tmp_path / "b.onnx"), "--strict"])
    assert strict.exit_code == 1
    assert f"--strict: {LAYERS} residual-score attention site(s) were not fused" in " ".join(strict.output.split())
    assert not (tmp_path / "b.onnx").exists()


def vit_onnx(model: torch.nn.Module) -> onnx.ModelProto:
    """``torch.onnx.export(dynamo=True)`` of a vision transformer with a dynamic batch, as a user would call it."""
    pixels = torch.randn(2, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return torch.onnx.export(model, (pixels,), dynamo=True, input_names=["pixels"], output_names=["logits"],
                                 dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},),
                                 opset_version=18).model_proto


def vit_matches_torch(onnx_model: onnx.ModelProto, model: torch.nn.Module) -> bool:
    """The class-token logits against PyTorch at a batch size the model was not traced at."""
    other = torch.randn(3, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = model(other).numpy()
    with OnnxRuntimeRunner(onnx_model) as runner:
        got = runner.infer({"pixels": other.numpy()})["logits"]
    return compare(np.asarray(got), expected, tolerance_for("float32")).ok


@pytest.mark.slow
def test_a_vision_transformer_with_heads_merged_into_the_batch_fuses_every_layer_and_matches_torch():
    """BmmRealFormerViT multiplies 3-D ``[B*H, N, d]`` heads with ``torch.bmm``: each layer becomes one node that
    reads them with a leading unit axis, chained through its scores, and the class-token logits match PyTorch at a
    batch size it was not traced at."""
    model = BmmRealFormerViT().eval()
    result, parity = fuse(vit_onnx(model))
    assert [s.reason for s in result.sites] == [""] * VIT_LAYERS and parity.ok
    nodes = attention_nodes(result.model)
    assert len(nodes) == result.fused_by_op[RESIDUAL_ATTENTION] == VIT_LAYERS
    assert "Softmax" not in {n.op_type for n in result.model.graph.node}
    producer = {o: n for n in result.model.graph.node for o in n.output}
    for before, after in itertools.pairwise(nodes):
        squeezed = producer[producer[inputs_of(after)["prev_scores"]].input[0]]
        assert squeezed.op_type == "Squeeze" and squeezed.input[0] == before.output[1]
    assert vit_matches_torch(result.model, model)


def test_a_vision_transformer_with_scores_laid_out_batch_query_key_heads_fuses_every_layer_and_matches_torch():
    """TokenMajorScoresViT's einsums lay the scores out ``[B, N, N, H]`` with the softmax over dim 2 (no node before):
    each layer is one node reading transposes of q, k, v and the previous scores, its outputs transposed back."""
    model = TokenMajorScoresViT().eval()
    result, parity = fuse(vit_onnx(model))
    assert [s.reason for s in result.sites] == [""] * VIT_LAYERS and parity.ok
    assert len(attention_nodes(result.model)) == result.fused_by_op[RESIDUAL_ATTENTION] == VIT_LAYERS
    assert not {"Softmax", "Einsum"} & {n.op_type for n in result.model.graph.node}
    assert vit_matches_torch(result.model, model)


@pytest.mark.slow
def test_a_masked_encoder_with_scores_laid_out_batch_query_key_heads_fuses_through_onnx_and_pt2(tmp_path):
    """TokenMajorScoresRealFormer adds a padding bias laid out ``[B, 1, T, 1]``: transposed with the scores."""
    model = TokenMajorScoresRealFormer().eval()
    result, parity = fuse(plain_onnx(TokenMajorScoresRealFormer, opset=23))
    assert result.fused_by_op == {RESIDUAL_ATTENTION: LAYERS} and parity.ok
    assert all(inputs_of(n)["mask_bias"] for n in attention_nodes(result.model))
    assert matches_torch(result.model, model)
    program, out = save_program(model, tmp_path / "layout.pt2"), tmp_path / "layout.onnx"
    exported = CliRunner().invoke(app, ["export", str(program), "-o", str(out)])
    assert exported.exit_code == 0, exported.output
    assert len(attention_nodes(onnx.load(str(out)))) == LAYERS and matches_torch(onnx.load(str(out)), model)
