"""``kimi-linear`` assembled from its export plan (``models/kimi/plan.py``) is the same model as its whole-model
trace: KDA layers (one ``KimiDeltaAttention`` node each, named as the whole-model trace names it) and NoPE latent
attention, dense and MoE feed-forwards, K3 AttnRes and standard residuals, plain and with-past graphs (the
recurrent and convolution states in and out) (tests/exporter/assembled_compare.py). ``attnres inspect`` reads the
same of both files (``summarize``: inputs, outputs, dims, opsets, target, attnres nodes, export metadata). A folder
laid out as Kimi K3 publishes it (``kimi_k3``: SiTU, latent MoE, the MLA output gate, the full-rank KDA gate) has its
own feed-forward kinds."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from attnres_export.exporter.assemble import plan_of
from attnres_export.models import load_checkpoint
from attnres_export.models.base import PlanAggregate
from attnres_export.models.registry import architecture
from tests.exporter.assembled_compare import Case, assert_same_model, example_folders
from tests.models.kimi.k3_reference import with_float_experts

FOLDERS = {"k3": ("kimi_linear", 2, 4), "k3-block1": ("kimi_linear", 1, 4), "standard": ("kimi_linear", None, 4),
           "k3-published": ("kimi_k3", 3, 5)}
"""name -> (model_type, attn_res_block_size or None for standard residuals, layers): KDA, KDA, KDA, latent
attention (and for ``kimi_k3`` K3's pattern of 5 layers: KDA x 3, latent attention, latent attention)."""

SLOW = [
    pytest.param(Case("k3"), 6, marks=pytest.mark.full),
    pytest.param(Case("k3", "float16", target="portable"), 6, marks=pytest.mark.full),
    pytest.param(Case("k3-block1", "float32", with_past=True), 6, marks=pytest.mark.full),
    (Case("k3-block1", "float16", with_past=True, fuse_norm=True), 7),
    pytest.param(Case("standard", "float16", with_past=True), 6, marks=pytest.mark.full),
    (Case("k3-published", "float16", with_past=True), 6),
]
"""(case, kinds of piece traced): embedding, KDA, latent attention, dense and MoE feed-forwards, head, and with
``fuse_norm`` the PreNorm-less kinds (layer 0's KDA keeps its PreNorm). The ``full`` cases repeat what the others
cover (CI keeps Kimi Linear with past and fuse-norm, and the K3 layout with past; the portable Kimi graphs are
built in CI by tests/backends/tensorrt/test_build_families_on_fake_tensorrt.py and tests/models/kimi)."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """The example folders; the K3 one with its MXFP4 experts decompressed, since a whole-model trace holds float
    weights only (``--trace-whole`` refuses a quantized checkpoint)."""
    made = example_folders("kimi-linear", FOLDERS, tmp_path_factory.mktemp("assembled_kimi"), seed=30)
    with_float_experts(made["k3-published"])
    return made


@pytest.mark.slow
@pytest.mark.parametrize(("case", "kinds"), SLOW, ids=lambda c: c.id() if isinstance(c, Case) else str(c))
def test_assembled_kimi_linear_is_the_whole_model_trace(folders, tmp_path, case, kinds):
    assert_same_model(folders[case.model], tmp_path, case, kinds)


def test_the_kimi_k3_with_past_plan_carries_every_state_and_one_aggregation_per_site(tmp_path):
    folder, _, _ = architecture("kimi-linear").write_example_folder("kimi_linear", tmp_path / "f", 1, 2, 4)
    model, _ = load_checkpoint(folder)
    plan = plan_of(model, with_past=True, fuse_norm=False)
    assert Counter(piece.kind for piece in plan.pieces()) == {"embedding": 1, "kda": 3, "latent-attention": 1,
                                                              "mlp": 1, "moe": 3, "head": 1}
    assert sum(isinstance(step, PlanAggregate) for step in plan.steps) == model.aggregation_count() == 8
    cache = model.with_past().cache_inputs()
    read = {name for piece in plan.pieces() for name in piece.inputs}
    made = {name for piece in plan.pieces() for name in piece.outputs}
    assert {c.name for c in cache} <= read and {c.present for c in cache} <= made
    kda = next(piece for piece in plan.pieces() if piece.kind == "kda")
    assert [value.dtype for value in kda.signature[2:]] == ["float32", "model", "model", "model"]


def test_a_k3_folders_own_feed_forwards_are_kinds_of_their_own(tmp_path):
    folder, _, _ = architecture("kimi-linear").write_example_folder("kimi_k3", tmp_path / "f", 1, 3, 5)
    model, _ = load_checkpoint(folder)
    kinds = Counter(piece.kind for piece in plan_of(model, with_past=False, fuse_norm=False).pieces())
    assert {kind: n for kind, n in kinds.items() if kind.startswith("Kimi")} == {"KimiMLP": 1, "KimiMoE": 4}
