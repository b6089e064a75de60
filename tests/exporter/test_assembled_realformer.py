"""``realformer`` assembled from its export plan (``models/realformer/plan.py``: the carried scores flow from layer
piece to layer piece) is the same model as its whole-model trace (tests/exporter/assembled_compare.py); with
``running_mean`` (a different constant per layer) it has no plan and is traced whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnres_export.exporter.assemble import plan_of
from attnres_export.models import save_checkpoint
from attnres_export.models.example import make_example
from attnres_export.models.realformer import RealFormerConfig
from tests.exporter.assembled_compare import Case, assert_same_model

SMALL = {"vocab_size": 31, "d_model": 16, "n_layers": 3, "n_heads": 2, "d_ff": 24, "max_seq_len": 16}


def _checkpoint(path: Path, **overrides) -> tuple[Path, object]:
    cfg = RealFormerConfig(**{**SMALL, **overrides})
    model = make_example(cfg, seed=5)
    save_checkpoint(model, cfg, path)
    return path, model


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=pytest.mark.full), "float16",
                                   pytest.param("bfloat16", marks=pytest.mark.full)])
def test_assembled_realformer_is_the_whole_model_trace(tmp_path, dtype):
    path, _ = _checkpoint(tmp_path / "realformer.pt")
    assert_same_model(path, tmp_path, Case("realformer", dtype), kinds=4)


def test_the_realformer_plan_carries_the_scores_and_running_mean_has_none(tmp_path):
    _, model = _checkpoint(tmp_path / "a.pt")
    plan = plan_of(model, with_past=False, fuse_norm=False)
    assert [(p.kind, p.inputs) for p in plan.pieces()] == [
        ("embedding", ("input_ids", "attention_mask")), ("first-layer", ("embedding", "mask_bias")),
        ("layer", ("layers.0.out", "mask_bias", "layers.0.scores")),
        ("layer-last", ("layers.1.out", "mask_bias", "layers.1.scores"))]
    assert plan.outputs == ("hidden",)
    _, running = _checkpoint(tmp_path / "b.pt", running_mean=True)
    assert plan_of(running, with_past=False, fuse_norm=False) is None
