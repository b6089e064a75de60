"""``decoder-lm`` assembled from its export plan (``models/decoder/plan.py``) is the same model as its whole-model
trace: dense and MoE feed-forwards (the MoE's ``If``/``Loop`` subgraphs copied per layer), grouped-query and
latent attention, K3 AttnRes and standard residuals, plain and with-past graphs
(tests/exporter/assembled_compare.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from attnres_export.exporter.assemble import plan_of
from attnres_export.models import load_checkpoint
from attnres_export.models.base import PlanAggregate
from attnres_export.models.registry import architecture
from tests.exporter.assembled_compare import Case, assert_same_model, example_folders

FOLDERS = {
    "llama": ("llama", None, 2),
    "qwen2-tied": ("qwen2", None, 2),
    "qwen3-k3": ("qwen3", 1, 3),
    "qwen3-moe-k3": ("qwen3_moe", 2, 3),
    "deepseek-k3": ("deepseek_v3", 1, 3),
    "deepseek": ("deepseek_v3", None, 2),
}
"""name -> (model_type, attn_res_block_size or None for standard residuals, layers)."""

SLOW = [
    pytest.param(Case("llama"), 4, marks=pytest.mark.full),
    pytest.param(Case("qwen3-k3", "float16"), 4, marks=pytest.mark.full),
    (Case("qwen3-k3", "bfloat16", with_past=True, fuse_norm=True), 5),
    (Case("qwen2-tied", "float32", with_past=True, target="portable"), 4),
    pytest.param(Case("qwen3-moe-k3", "float32", with_past=True), 4, marks=pytest.mark.full),
    (Case("qwen3-moe-k3", "float16", fuse_norm=True), 5),
    pytest.param(Case("qwen3-moe-k3", "bfloat16", with_past=True), 4, marks=pytest.mark.full),
    (Case("deepseek-k3", "float32", with_past=True, fuse_norm=True), 6),
    pytest.param(Case("deepseek", "float16", with_past=True), 5, marks=pytest.mark.full),
]
"""(case, kinds of piece traced): embedding, attention (grouped-query or latent), dense and/or MoE feed-forward,
head, and with ``fuse_norm`` layer 0's attention that keeps its PreNorm. The ``full`` cases repeat what the others
cover (each dtype, target, with-past and fuse-norm stays in CI's ``-m "slow and not full"``, and every family
but Llama, whose dense body Qwen2 and Qwen3 share)."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    return example_folders("decoder-lm", FOLDERS, tmp_path_factory.mktemp("assembled_decoders"), seed=20)


@pytest.mark.slow
@pytest.mark.parametrize(("case", "kinds"), SLOW, ids=lambda c: c.id() if isinstance(c, Case) else str(c))
def test_assembled_decoder_is_the_whole_model_trace(folders, tmp_path, case, kinds):
    assert_same_model(folders[case.model], tmp_path, case, kinds)


def test_the_deepseek_k3_plan_has_one_piece_per_sublayer_and_one_aggregation_per_site(tmp_path):
    folder, _, _ = architecture("decoder-lm").write_example_folder("deepseek_v3", tmp_path / "f", 1, 1, 3)
    model, _ = load_checkpoint(folder)
    plan = plan_of(model, with_past=True, fuse_norm=True)
    kinds = Counter(piece.kind for piece in plan.pieces())
    assert kinds == {"embedding": 1, "latent-attention": 1, "latent-attention-prenormed": 2, "mlp-prenormed": 1,
                     "moe-prenormed": 2, "head": 1}
    aggregates = [step for step in plan.steps if isinstance(step, PlanAggregate)]
    assert len(aggregates) == model.fused_node_count() == 6
    assert all(step.norm_weight is not None for step in aggregates)
    assert [len(step.sources) for step in aggregates] == [2, 2, 3, 3, 4, 4]
    assert plan.outputs == ("logits", *(c.present for c in model.with_past().cache_inputs()))
