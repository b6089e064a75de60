"""The assembled export (each kind of piece traced once, the graph assembled from the model's plan) is the same model
as the whole-model trace: the two ONNX files, exported from one checkpoint, agree on ONNX Runtime, and have the same
inputs, outputs, dims, metadata and attnres nodes; and the plan's promises (no weight in the trace, the model's own
tensors written, unlike pieces refused) hold."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx
import pytest
import torch

from attnres_export.errors import ExportError
from attnres_export.exporter.assemble import assemble, plan_of
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.exporter.piece_trace import trace_kinds
from attnres_export.models import load_checkpoint
from attnres_export.models.base import PlanPiece
from attnres_export.models.example import make_example
from attnres_export.models.realformer import RealFormerConfig
from tests.conftest import write_checkpoint
from tests.exporter.assembled_compare import RANGES, Case, assert_same_model

MODELS = {
    "full": {"n_layers": 2, "block_size": 0},
    "block2": {"n_layers": 2, "block_size": 2},
    "block4_tail": {"n_layers": 3, "block_size": 4},
    "standard": {"n_layers": 2, "residual": "standard"},
}
KINDS = 4
"""embedding, attention sublayer, MLP sublayer, head."""
FAST = Case("block4_tail")
SLOW = [
    Case("full", "float16"),
    Case("block2", "bfloat16", fuse_norm=True),
    pytest.param(Case("standard", "bfloat16"), marks=pytest.mark.full),
    pytest.param(Case("block4_tail", "float32", target="portable"), marks=pytest.mark.full),
    Case("standard", "float32", with_past=True),
    pytest.param(Case("full", "bfloat16", with_past=True), marks=pytest.mark.full),
    Case("block2", "float16", with_past=True, fuse_norm=True),
    Case("block4_tail", "float32", with_past=True, fuse_norm=True, target="portable"),
]
"""The ``full`` cases repeat what the others cover: each residual kind, dtype, target, with-past and fuse-norm
stays in CI's ``-m "slow and not full"``."""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("assembled_models")
    return {name: write_checkpoint(root / f"{name}.pt", seed=10 + i, **cfg)
            for i, (name, cfg) in enumerate(MODELS.items())}


@pytest.mark.slow
def test_assembled_export_is_the_whole_model_trace_block_float32(checkpoints, tmp_path):
    assert_same_model(checkpoints[FAST.model], tmp_path, FAST, KINDS)


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW, ids=Case.id)
def test_assembled_export_is_the_whole_model_trace(checkpoints, tmp_path, case):
    assert_same_model(checkpoints[case.model], tmp_path, case, KINDS)


@pytest.fixture(scope="module")
def traced_block2(checkpoints):
    """The block2 model, its plan, and each kind traced once (shared by the plan checks below)."""
    model, _ = load_checkpoint(checkpoints["block2"])
    plan = plan_of(model, with_past=False, fuse_norm=False)
    traced, template = trace_kinds(plan.pieces(), RANGES, {"batch": 2, "seq": 5}, "float32", 18)
    return model, plan, traced, template


def test_the_trace_holds_no_weight_and_the_assembly_writes_the_models_own_tensors(traced_block2):
    model, plan, traced, template = traced_block2
    weights = {name for kind in traced.values() for name, _ in kind.weights}
    assert {"embed.weight", "rotary.cos", "fn.wq.weight", "prenorm.weight", "lm_head.weight"} <= weights
    assert all(init.const_value.nbytes <= 64 for init in template.graph.initializers.values())
    assembled = assemble(plan, traced, model, "float32", template)
    state = {name: t for name, t in [*model.named_parameters(), *model.named_buffers()]}
    written = {name: v.const_value for name, v in assembled.graph.initializers.items() if name in state}
    assert {"embed.weight", "layers.1.mlp_norm.weight", "rotary.cos"} <= set(written)
    assert all(tensor.raw.data_ptr() == state[name].data_ptr() for name, tensor in written.items())
    transposed = assembled.graph.initializers["layers.1.attn.wq.weight.transpose"].const_value
    assert torch.equal(torch.from_numpy(transposed.numpy()), model.layers[1].attn.wq.weight.detach().T)
    assert "layers.1.attn.wq.weight" not in assembled.graph.initializers


def test_a_plan_putting_unlike_pieces_in_one_kind_is_refused(traced_block2):
    model, plan, traced, template = traced_block2
    steps = list(plan.steps)
    at = next(i for i, s in enumerate(steps) if isinstance(s, PlanPiece) and s.name == "layers.1.attn")
    steps[at] = dataclasses.replace(steps[at], module=steps[at + 2].module)  # an MLP piece in the attention kind
    with pytest.raises(ExportError, match="puts unlike pieces in one kind"):
        assemble(dataclasses.replace(plan, steps=tuple(steps)), traced, model, "float32", template)


def test_a_plan_reading_a_value_nothing_produces_is_refused(traced_block2):
    model, plan, traced, template = traced_block2
    steps = [dataclasses.replace(s, sources=("nowhere",)) if getattr(s, "name", "") == "out_res" else s
             for s in plan.steps]
    with pytest.raises(ExportError, match="reads 'nowhere', which no graph input or earlier step produces"):
        assemble(dataclasses.replace(plan, steps=tuple(steps)), traced, model, "float32", template)


def test_a_model_without_a_plan_is_traced_whole():
    realformer = make_example(RealFormerConfig(vocab_size=31, d_model=16, n_layers=2, n_heads=2, d_ff=24,
                                               max_seq_len=16, running_mean=True))
    assert plan_of(realformer, with_past=False, fuse_norm=False) is None


@pytest.mark.slow
def test_the_fused_node_count_check_reads_the_assembled_graph(checkpoints, tmp_path, monkeypatch):
    from attnres_export.models.registry import architecture

    model_type = architecture("attnres-lm").model_type()
    monkeypatch.setattr(model_type, "fused_node_count", lambda self: self.aggregation_count() + 1)
    with pytest.raises(ExportError, match="expected 8 attnres nodes, the export has 7"):
        export_checkpoint(ExportOptions(checkpoints["block4_tail"], tmp_path / "m.onnx", check=False, **RANGES))
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_trace_whole_on_the_command_line_traces_the_whole_model(checkpoints, tmp_path):
    from typer.testing import CliRunner

    from attnres_export.cli import export_app

    out = tmp_path / "m.onnx"
    result = CliRunner().invoke(export_app, [str(checkpoints["block2"]), "-o", str(out), "--no-check",
                                             "--trace-whole", "--seq", "1:5:16"])
    assert result.exit_code == 0, result.output
    names = {init.name for init in onnx.load(str(out), load_external_data=False).graph.initializer}
    assert "embed.weight" in names and not any(name.endswith(".transpose") for name in names)
