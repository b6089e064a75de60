"""The loader's NaN/infinity check (a float32 sum first, element by element only when the sum is not finite) refuses
every non-finite weight and accepts finite weights whose sum overflows float32."""

from __future__ import annotations

import pytest
import torch

from attnres_export.errors import CheckpointError
from attnres_export.models import load_checkpoint, save_checkpoint
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example
from tests.conftest import SMALL


def _checkpoint(tmp_path, dtype: torch.dtype, values: list[float]):
    cfg = AttnResLMConfig(**SMALL, n_layers=1)
    model = make_example(cfg, seed=0).to(dtype)
    with torch.no_grad():
        model.layers[0].mlp.w1.weight.view(-1)[3:3 + len(values)] = torch.tensor(values, dtype=dtype)
    save_checkpoint(model, cfg, tmp_path / "m.pt")
    return tmp_path / "m.pt"


@pytest.mark.parametrize(("dtype", "values"), [
    (torch.float32, [float("nan")]),
    (torch.float32, [float("inf"), float("-inf")]),
    (torch.float16, [float("inf")]),
    (torch.bfloat16, [float("-inf"), 1.0, float("nan")]),
], ids=["nan", "inf-minus-inf", "float16-inf", "bfloat16-nan"])
def test_a_weight_with_nan_or_infinity_is_refused(tmp_path, dtype, values):
    with pytest.raises(CheckpointError, match=r"state_dict\['layers.0.mlp.w1.weight'\] holds NaN or infinite"):
        load_checkpoint(_checkpoint(tmp_path, dtype, values), dtype=None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_finite_weights_whose_sum_overflows_float32_load(tmp_path, dtype):
    model, _ = load_checkpoint(_checkpoint(tmp_path, dtype, [3e38, 3e38, 3e38]), dtype=None)
    assert model.layers[0].mlp.w1.weight.view(-1)[3].item() == pytest.approx(3e38, rel=1e-2)
