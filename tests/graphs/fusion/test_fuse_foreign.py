"""Pattern fusion of AttnRes models written elsewhere: every aggregation fused, nothing else touched."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from attnres_export.ops.opset import AGGREGATE
from tests.conftest import slow_after
from tests.graphs.fusion.foreign_models import (
    NEGATIVE,
    POSITIVE,
    STATIC,
    InPlaceBankLM,
    OnesPartialLM,
    PaperTwoPhaseLM,
    StackEinsumLM,
    TwoPhaseOnlineLM,
    TwoPhaseRunningLongBlockLM,
    TwoPhaseUnscaledMergeLM,
)
from tests.graphs.fusion.helpers import fuse, fused_count, matches_torch, plain_onnx, save_program


@pytest.mark.parametrize("style", slow_after(sorted(POSITIVE), fast=0))
def test_plain_dynamo_export_at_opset_23_fuses_every_aggregation_and_matches_torch(style):
    model = POSITIVE[style]().eval()
    result, parity = fuse(plain_onnx(POSITIVE[style], opset=23))
    assert [s.reason for s in result.sites if not s.fused] == []
    assert fused_count(result.model) == result.fused_by_op[AGGREGATE] == model.aggregations
    assert parity.ok
    assert matches_torch(result.model, model)


@pytest.fixture(scope="module")
def stack_einsum_fused() -> onnx.ModelProto:
    """StackEinsumLM's plain export, fused once for the tests that only read the result."""
    return fuse(plain_onnx(StackEinsumLM, opset=18))[0].model


def test_concatenations_that_only_fed_aggregations_are_removed(stack_einsum_fused):
    fused = stack_einsum_fused
    assert not [n for n in fused.graph.node if n.op_type in ("Concat", "Softmax", "Einsum")]


def test_score_weights_are_the_folded_gain_times_query_for_every_source_count(stack_einsum_fused):
    model = StackEinsumLM().eval()
    fused = stack_einsum_fused
    inits = {i.name: numpy_helper.to_array(i) for i in fused.graph.initializer}
    nodes = [n for n in fused.graph.node if n.domain == "attnres"]
    expected = (model.gain * model.query).detach().numpy()
    for i, node in enumerate(nodes):
        assert len(node.input) - 1 == i + 1
        np.testing.assert_allclose(inits[node.input[0]], expected[i], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("style", slow_after(sorted(NEGATIVE), fast=0))
def test_non_attnres_softmaxes_are_left_alone(style):
    original = plain_onnx(NEGATIVE[style], opset=18)
    result, parity = fuse(original)
    assert result.fused_by_op == {} and fused_count(result.model) == 0
    assert len(result.sites) == 5 and all(s.reason for s in result.sites)
    assert len(result.model.graph.node) == len(original.graph.node)
    assert parity.ok


@pytest.mark.slow
def test_a_softmax_over_tokens_is_rejected_because_it_weighs_no_stack_of_sources():
    result, _ = fuse(plain_onnx(NEGATIVE["softmax-over-tokens"], opset=18))
    assert {s.reason for s in result.sites} == {
        "the weighted tensor could not be traced to separate source tensors (not a stack)"}


@pytest.mark.slow
def test_our_own_portable_decomposition_is_fused_back_and_attention_softmaxes_are_classified_as_attention(tmp_path):
    from typer.testing import CliRunner

    from attnres_export.cli import app
    from tests.conftest import write_checkpoint

    checkpoint = write_checkpoint(tmp_path / "own.pt", n_layers=2, block_size=2)
    portable = tmp_path / "own.portable.onnx"
    runner = CliRunner()
    assert runner.invoke(app, ["export", str(checkpoint), "--target", "portable", "--no-check", "-o",
                               str(portable)]).exit_code == 0
    out = tmp_path / "refused.onnx"
    result = runner.invoke(app, ["fuse", str(portable), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert fused_count(onnx.load(str(out))) == 5
    assert "5 found, 5 fused, 0 left unfused; 2 attention and 0 other softmaxes" in result.output
    assert "warning" not in result.output


@pytest.mark.slow
def test_unfused_depth_aggregations_warn_and_fail_with_strict(tmp_path):
    """NoNormLM aggregates over depth without normalized keys: a depth aggregation that is not AttnRes."""
    from typer.testing import CliRunner

    from attnres_export.cli import app

    source = tmp_path / "nonorm.onnx"
    onnx.save(plain_onnx(NEGATIVE["no-norm"], opset=18), str(source))
    runner = CliRunner()
    result = runner.invoke(app, ["fuse", str(source), "-o", str(tmp_path / "a.onnx")])
    assert result.exit_code == 0, result.output
    assert "5 depth aggregation site(s) were not fused, or only in part" in result.output
    strict = runner.invoke(app, ["fuse", str(source), "-o", str(tmp_path / "b.onnx"), "--strict"])
    assert strict.exit_code == 1
    assert "--strict: 5 depth aggregation site(s) were not fused, or only in part" in strict.output
    assert not (tmp_path / "b.onnx").exists()


class DeepStackEinsumLM(StackEinsumLM):
    """Full AttnRes over 40 sublayers at D = 512: aggregations of up to 41 sources, where probing alone used to
    leave about 1e-5 of float32 rounding in the score weight and 4 of 41 sites failed their check."""

    aggregations = 41

    def __init__(self, **kw) -> None:
        super().__init__(n_sub=40, dim=512, **kw)


@pytest.mark.slow
def test_aggregations_over_many_sources_fuse_with_the_score_weight_taken_from_the_graphs_constants():
    model = DeepStackEinsumLM().eval()
    result, _ = fuse(plain_onnx(DeepStackEinsumLM, opset=18))
    assert [s.reason for s in result.sites if not s.fused] == []
    inits = {i.name: numpy_helper.to_array(i) for i in result.model.graph.initializer}
    nodes = [n for n in result.model.graph.node if n.domain == "attnres"]
    expected = (model.gain * model.query).detach().numpy()
    worst = max(float(np.abs(inits[n.input[0]] - expected[len(n.input) - 2]).max()) for n in nodes)
    assert len(nodes) == model.aggregations and worst < 1e-6


class ZeroEpsLM(StackEinsumLM):
    """eps = 0 at D = 512: the probe's logit gap is 2 sqrt(D) sw_k whatever its size, so probing saturates."""

    def __init__(self, **kw) -> None:
        super().__init__(dim=512, **kw)
        self.eps = 0.0


@pytest.mark.slow
def test_an_eps_of_zero_fuses_through_the_graphs_constants_when_probing_saturates():
    model = ZeroEpsLM().eval()
    result, parity = fuse(plain_onnx(ZeroEpsLM, opset=18))
    assert [s.reason for s in result.sites if not s.fused] == []
    assert {s.eps for s in result.sites} == {0.0} and parity.ok
    assert matches_torch(result.model, model)


def _score_weight_rows(result_model: onnx.ModelProto, expected: np.ndarray) -> list[int]:
    """For each fused node (graph order), the row of ``expected`` its score weight equals."""
    inits = {i.name: numpy_helper.to_array(i) for i in result_model.graph.initializer}
    return [next((i for i, row in enumerate(expected)
                  if np.allclose(inits[node.input[0]], row, rtol=1e-4, atol=1e-5)), -1)
            for node in result_model.graph.node if node.domain == "attnres"]


TWO_PHASE = ["two-phase-lse", "two-phase-running", "two-phase-sigmoid"]


@pytest.mark.slow
@pytest.mark.parametrize(("style", "opset"), slow_after([(s, o) for s in TWO_PHASE for o in (18, 23)], fast=2))
def test_two_phase_merges_fuse_into_one_node_over_the_blocks_and_the_partial(style, opset):
    """Phase 1 over the completed blocks and the online-softmax merge with the partial sum become one
    AttnResAggregate over [blocks..., partial]: 1, 2 (merged), 2, 3 (merged) and 3 sources."""
    model = POSITIVE[style]().eval()
    result, parity = fuse(plain_onnx(POSITIVE[style], opset=opset))
    assert [s.reason for s in result.sites] == [""] * model.aggregations
    nodes = [n for n in result.model.graph.node if n.domain == "attnres"]
    assert [len(n.input) - 1 for n in nodes] == [1, 2, 2, 3, 3]
    assert not {n.op_type for n in result.model.graph.node} & {"Softmax", "Exp", "ReduceLogSumExp", "Max",
                                                               "Sigmoid", "ReduceMax", "Einsum"}
    assert _score_weight_rows(result.model, (model.gain * model.query).detach().numpy()) == [0, 1, 2, 3, 4]
    assert parity.ok and matches_torch(result.model, model)


@pytest.mark.slow
@pytest.mark.parametrize("cls", slow_after([TwoPhaseOnlineLM, TwoPhaseRunningLongBlockLM]))
def test_merges_far_after_their_phase_1_and_of_an_unnormalized_phase_1_fuse_over_the_blocks_and_the_partial(cls):
    """Blocks of 4: phase 1 for all queries of a block runs before its sublayers, so the merges come many nodes
    later; TwoPhaseOnlineLM keeps phase 1 unnormalized, normalized only by the merge. Every merged sublayer is one
    node over [blocks..., partial] with its own score weight."""
    model = cls().eval()
    result, parity = fuse(plain_onnx(cls, opset=18))
    assert [s.reason for s in result.sites] == [""] * model.aggregations
    nodes = [n for n in result.model.graph.node if n.domain == "attnres"]
    assert [len(n.input) - 1 for n in nodes] == [1, 2, 2, 2, 2, 3, 3, 3, 3]
    assert not {n.op_type for n in result.model.graph.node} & {"Softmax", "Exp", "Max", "ReduceMax"}
    assert _score_weight_rows(result.model, (model.gain * model.query).detach().numpy()) == list(range(9))
    assert parity.ok and matches_torch(result.model, model)


def test_the_papers_two_phase_inference_with_a_batched_online_softmax_fuses_every_aggregation_and_matches_torch():
    """PaperTwoPhaseLM (Algorithm 1 of the AttnRes paper, 0 of 9 fused before): every query of a block's batched
    inter-block softmax is a site; merged online with the partial, it is one node over [blocks..., partial], and the
    one-key softmax over the partial is fused with it as part of that node."""
    model = PaperTwoPhaseLM().eval()
    result, parity = fuse(plain_onnx(PaperTwoPhaseLM, opset=18))
    assert result.fused_by_op == {AGGREGATE: model.aggregations} and result.unfused == []
    assert [s.fused for s in result.sites] == [True] * 15 and sum(bool(s.part_of) for s in result.sites) == 6
    nodes = [n for n in result.model.graph.node if n.domain == "attnres"]
    assert [len(n.input) - 1 for n in nodes] == [1, 2, 2, 2, 2, 3, 3, 3, 3]
    assert not {n.op_type for n in result.model.graph.node} & {"Exp", "Einsum", "Max", "ReduceMax"}
    assert _score_weight_rows(result.model, model.query.detach().numpy()) == list(range(9))
    assert parity.ok and matches_torch(result.model, model)


@pytest.mark.slow
def test_a_merge_that_is_not_attnres_keeps_phase_1_fused_alone_and_the_report_says_why():
    """TwoPhaseUnscaledMergeLM's merge is exact over one block (sublayer 1) and wrong over two (sublayer 3)."""
    model = TwoPhaseUnscaledMergeLM().eval()
    result, parity = fuse(plain_onnx(TwoPhaseUnscaledMergeLM, opset=18))
    assert [s.sources for s in result.sites] == [1, 2, 2, 2, 3] and all(s.fused for s in result.sites)
    partial = [s.reason for s in result.sites if s.reason]
    assert len(partial) == 1 and partial[0].startswith("phase 1 only: its merge with ")
    assert "differs from AttnResAggregate" in partial[0]
    assert [s.reason for s in result.unfused] == partial
    assert "Max" in {n.op_type for n in result.model.graph.node}
    assert parity.ok and matches_torch(result.model, model)


@pytest.mark.slow
@pytest.mark.parametrize(("style", "opset"), slow_after([(s, o) for s in sorted(STATIC) for o in (18, 23)], fast=2))
def test_static_exports_fuse_zero_partial_sources_that_folded_to_constants(style, opset):
    """With static shapes, the zeros_like partial of each block's first sublayer is an initializer (stacked, or
    a source whose score folded to a constant); the fused node takes it as a source, so the zero still weighs in
    the softmax with logit 0."""
    model = STATIC[style]().eval()
    original = plain_onnx(STATIC[style], opset=opset, static=True)
    result, parity = fuse(original)
    assert [s.reason for s in result.sites] == [""] * model.aggregations
    inits = {i.name: numpy_helper.to_array(i) for i in result.model.graph.initializer}
    nodes = [n for n in result.model.graph.node if n.domain == "attnres"]
    assert [len(n.input) - 1 for n in nodes] == [2, 2, 3, 3, 3]
    zero_sources = [n.input[-1] for n in nodes if n.input[-1] in inits]
    assert len(zero_sources) == 2 and not any(inits[z].any() for z in zero_sources)
    gains = model.gain if style == "zeros-partial-stack" else torch.stack([norm.weight for norm in model.norms])
    assert _score_weight_rows(result.model, (gains * model.query).detach().numpy()) == [0, 1, 2, 3, 4]
    assert parity.ok and matches_torch(result.model, model, batch=2, seq=5)


@pytest.mark.slow
def test_a_constant_source_that_is_not_zero_is_left_unfused_with_that_reason():
    model = OnesPartialLM().eval()
    result, parity = fuse(plain_onnx(OnesPartialLM, opset=18, static=True))
    assert fused_count(result.model) == result.fused_by_op[AGGREGATE] == model.aggregations
    unfused = result.unfused
    assert len(unfused) == 2 and all("is a constant that is not zero" in s.reason for s in unfused)
    assert parity.ok and matches_torch(result.model, model, batch=2, seq=5)


@pytest.mark.slow
def test_a_bank_written_in_place_fuses_every_aggregation_through_plain_onnx_and_through_a_pt2(tmp_path):
    """InPlaceBankLM writes its sources into a view of a preallocated bank (slice assignment and ``copy_``): the
    source tracer follows the ScatterND and ScatterElements writes back to the tensors written, and the bank dies."""
    from typer.testing import CliRunner

    from attnres_export.cli import app

    model = InPlaceBankLM().eval()
    original = plain_onnx(InPlaceBankLM, opset=18)
    assert {"ScatterND", "ScatterElements"} <= {n.op_type for n in original.graph.node}
    result, parity = fuse(original)
    assert [s.reason for s in result.sites if not s.fused] == []
    assert result.fused_by_op == {AGGREGATE: model.aggregations} and parity.ok
    assert not {"ScatterND", "ScatterElements"} & {n.op_type for n in result.model.graph.node}
    assert matches_torch(result.model, model)
    program, out = save_program(model, tmp_path / "bank.pt2"), tmp_path / "bank.onnx"
    exported = CliRunner().invoke(app, ["export", str(program), "-o", str(out)])
    assert exported.exit_code == 0, exported.output
    assert fused_count(onnx.load(str(out))) == model.aggregations
    assert matches_torch(onnx.load(str(out)), model)


class TinyEpsLM(StackEinsumLM):
    """eps = 1e-9: torch.onnx.export's default optimizer folds the ``+ eps`` of its RMS norms away."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.eps = 1e-9


@pytest.mark.slow
def test_rms_norms_whose_eps_the_exporters_optimizer_dropped_are_fused_with_eps_0_and_one_warning_naming_the_fix(
        tmp_path):
    from typer.testing import CliRunner

    from attnres_export.cli import app

    source, out, report = tmp_path / "tiny_eps.onnx", tmp_path / "fused.onnx", tmp_path / "fuse.json"
    onnx.save(plain_onnx(TinyEpsLM, opset=18), str(source))
    result = CliRunner().invoke(app, ["fuse", str(source), "-o", str(out), "--report", str(report)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert text.count("RMS norm without eps") == 1 and "optimize=False" in text and ".pt2 program" in text
    data = json.loads(report.read_text())
    assert [len(places) for places in data["warnings"].values()] == [TinyEpsLM.aggregations]
    assert all(s["fused"] and s["eps"] == 0 for s in data["sites"]), data["sites"]
