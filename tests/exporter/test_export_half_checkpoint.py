"""A checkpoint stored in float16 (as released models are) exports in float16 from the weights as loaded, and its
check compares with PyTorch computing in float32/float64 from those same weights: plain and with-past graphs."""

from __future__ import annotations

import pytest
import torch

from attnres_export.dims import DimRange
from attnres_export.exporter import checkpoint as export
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.models import save_checkpoint
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example
from attnres_export.models.store import Checkpoint
from tests.conftest import SMALL


@pytest.fixture(scope="module")
def float16_checkpoint(tmp_path_factory):
    cfg = AttnResLMConfig(**SMALL, n_layers=2, block_size=2)
    path = tmp_path_factory.mktemp("float16") / "m.pt"
    save_checkpoint(make_example(cfg, seed=7).to(torch.float16), cfg, path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("with_past", [False, True])
def test_a_float16_checkpoint_exports_in_float16_and_matches_pytorch_from_the_same_weights(float16_checkpoint,
                                                                                         tmp_path, with_past):
    result = export_checkpoint(ExportOptions(float16_checkpoint, tmp_path / "m.onnx", dtype="float16",
                                             batch=DimRange(1, 2, 3), seq=DimRange(1, 4, 8), with_past=with_past))
    assert result.report is not None and result.report.ok, result.report.to_dict()
    assert result.files == [tmp_path / "m.onnx"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    backends = {check.backend for check in result.report.checks}
    assert backends == {"onnxruntime+ref-ops"}


@pytest.mark.slow
def test_a_float32_checkpoint_exports_in_float16_streamed_and_is_checked_against_its_float32_weights(
        tmp_path, monkeypatch):
    """The traced model is the streamed one in float16 (``_models``: its large tensors read cast as they are
    written) and the reference is read afterwards from the same open checkpoint as stored: in that order, one open,
    and the check passes against PyTorch on the stored float32 weights."""
    cfg = AttnResLMConfig(**SMALL, n_layers=2, block_size=2)
    path = tmp_path / "m.pt"
    save_checkpoint(make_example(cfg, seed=8), cfg, path)
    calls = []
    streamed, model = Checkpoint.streamed_model, Checkpoint.model
    monkeypatch.setattr(Checkpoint, "streamed_model", lambda self, dtype: calls.append(("streamed", dtype))
                        or streamed(self, dtype))
    monkeypatch.setattr(Checkpoint, "model", lambda self, dtype="float32": calls.append(("model", dtype))
                        or model(self, dtype))
    result = export.export_checkpoint(ExportOptions(path, tmp_path / "m.onnx", dtype="float16",
                                                    batch=DimRange(1, 2, 3), seq=DimRange(1, 4, 8)))
    assert calls == [("streamed", "float16"), ("model", None)]
    assert result.report is not None and result.report.ok, result.report.to_dict()
