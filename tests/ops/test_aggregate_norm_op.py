"""attnres::aggregate_norm against an independent float64 NumPy reference, and against the unfused pair it
replaces (AttnResAggregate, then the model's RMSNorm): the same math, so the same values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnres_export.models.layers.norm import RMSNorm
from attnres_export.ops import attnres_aggregate, attnres_aggregate_numpy_in
from attnres_export.ops.aggregate_norm import attnres_aggregate_norm, attnres_aggregate_norm_reference
from attnres_export.ops.numpy_ref import rms_norm_numpy_in

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
REL_L2 = {"float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}
"""The op computes in float32 from the stored values; the bars cover the rounding of h and y to the storage type."""


def random_case(n: int, d: int, lead: tuple[int, ...], dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    sources = [(torch.randn(*lead, d, generator=gen) * (0.5 + i)).to(dtype) for i in range(n)]
    score_weight = torch.randn(d, generator=gen) * (3.0 / d**0.5)
    norm_weight = 1 + 0.1 * torch.randn(d, generator=gen)
    return score_weight, norm_weight, sources


def float64_reference(score_weight, norm_weight, sources, eps, norm_eps) -> np.ndarray:
    h = attnres_aggregate_numpy_in(np.float64, score_weight.double().numpy(),
                                   [s.double().numpy() for s in sources], eps)
    return rms_norm_numpy_in(np.float64, h, norm_weight.double().numpy(), norm_eps)


def rel_l2(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(("n", "d", "lead"), [(1, 64, (1,)), (2, 1000, (1, 1)), (3, 4096, (2, 3)),
                                              (9, 1000, (4, 1, 2)), (5, 33, (7,)), (4, 7168, (1,))])
def test_op_matches_float64_numpy_reference_on_random_inputs(n, d, lead, dtype):
    score_weight, norm_weight, sources = random_case(n, d, lead, DTYPES[dtype], seed=n * 1000 + d)
    y = attnres_aggregate_norm(score_weight, norm_weight, sources, 1e-6, 1e-5)
    assert y.dtype == DTYPES[dtype] and y.shape == sources[0].shape
    ref = float64_reference(score_weight, norm_weight, sources, 1e-6, 1e-5)
    assert rel_l2(y.double().numpy(), ref) <= REL_L2[dtype]


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_op_equals_the_models_aggregation_then_rmsnorm_exactly(dtype):
    score_weight, norm_weight, sources = random_case(5, 1000, (3, 2), DTYPES[dtype], seed=11)
    norm = RMSNorm(1000, 1e-5).to(DTYPES[dtype])
    with torch.no_grad():
        norm.weight.copy_(norm_weight)
    unfused = norm(attnres_aggregate(score_weight, sources, 1e-6))
    fused = attnres_aggregate_norm(score_weight, norm.weight.float(), sources, 1e-6, 1e-5)
    torch.testing.assert_close(fused, unfused, rtol=0, atol=0)


def test_reference_returns_the_aggregate_rounded_to_the_storage_type_as_h():
    score_weight, norm_weight, sources = random_case(3, 64, (4,), torch.bfloat16, seed=5)
    y, h = attnres_aggregate_norm_reference(score_weight, norm_weight, sources, 1e-6, 1e-5)
    torch.testing.assert_close(h, attnres_aggregate(score_weight, sources, 1e-6), rtol=0, atol=0)
    assert y.dtype == h.dtype == torch.bfloat16


def test_gold_single_source_gives_its_rmsnorm():
    v = torch.tensor([[3.0, 4.0]])
    y = attnres_aggregate_norm(torch.zeros(2), torch.tensor([1.0, 2.0]), [v], 0.0, 0.0)
    rms = (12.5) ** 0.5
    torch.testing.assert_close(y, torch.tensor([[3.0 / rms, 8.0 / rms]]), rtol=1e-7, atol=0)


def test_op_rejects_a_norm_weight_that_is_not_the_last_dim():
    with pytest.raises(ValueError, match="norm_weight is \\(5,\\), expected \\[4\\]"):
        attnres_aggregate_norm(torch.ones(4), torch.ones(5), [torch.ones(2, 4)], 1e-6, 1e-6)


def test_fake_implementation_gives_the_shape_and_dtype_of_source_zero():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        sources = [torch.empty(2, 3, 8, dtype=torch.float16) for _ in range(3)]
        out = torch.ops.attnres.aggregate_norm(torch.empty(8), torch.empty(8), sources, 1e-6, 1e-5)
    assert out.shape == (2, 3, 8) and out.dtype == torch.float16
