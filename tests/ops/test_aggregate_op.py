"""The attnres::aggregate op against the independent NumPy reference and the gold checks of docs/parity.md."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnres_export.ops import attnres_aggregate, attnres_aggregate_numpy_in

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Bars for the op's output against a float64 reference on the same stored inputs: the op computes in float32,
# so only the final rounding to the storage type separates them.
REL_L2 = {"float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}


def rel_l2(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def random_case(n: int, d: int, lead: tuple[int, ...], dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    sources = [(torch.randn(*lead, d, generator=gen) * (0.5 + i)).to(dtype) for i in range(n)]
    score_weight = torch.randn(d, generator=gen) * (3.0 / d**0.5)
    return score_weight, sources


def as_f64(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(
    ("n", "d", "lead"),
    [(1, 64, (1,)), (2, 1000, (1, 1)), (3, 4096, (2, 3)), (9, 1000, (4, 1, 2)), (16, 64, (5, 7)), (5, 1, (3,)),
     (7, 33, (1,))],
)
def test_op_matches_numpy_reference_on_random_inputs(n, d, lead, dtype):
    score_weight, sources = random_case(n, d, lead, DTYPES[dtype], seed=n * 1000 + d)
    out = attnres_aggregate(score_weight, sources, 1e-6)
    assert out.dtype == DTYPES[dtype] and out.shape == sources[0].shape
    ref = attnres_aggregate_numpy_in(np.float64, as_f64(score_weight), [as_f64(s) for s in sources], 1e-6)
    assert rel_l2(as_f64(out), ref) <= REL_L2[dtype]


def test_float32_op_matches_float64_reference_to_about_1e6():
    score_weight, sources = random_case(9, 7168, (16,), torch.float32, seed=7)
    out = attnres_aggregate(score_weight, sources, 1e-6).double().numpy()
    ref = attnres_aggregate_numpy_in(np.float64, as_f64(score_weight), [as_f64(s) for s in sources], 1e-6)
    assert rel_l2(out, ref) < 1e-6


def test_zero_pseudo_query_gives_exactly_the_mean_of_the_sources():
    _, sources = random_case(5, 64, (3,), torch.float32, seed=1)
    out = attnres_aggregate(torch.zeros(64), sources, 1e-6)
    torch.testing.assert_close(out, torch.stack(sources).mean(0), rtol=1e-6, atol=1e-7)


def test_gold_two_one_hot_sources_give_the_spec_weights():
    a = torch.tensor([1.0, 0.0, 0.0, 0.0])
    b = torch.tensor([0.0, 1.0, 0.0, 0.0])
    out = attnres_aggregate(torch.tensor([2.0, 0.0, 0.0, 0.0]), [a, b], 0.0)
    assert out[0].item() == pytest.approx(0.98201379, abs=1e-7)
    assert out[1].item() == pytest.approx(0.01798621, abs=1e-7)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_huge_pseudo_query_gives_finite_output_equal_to_the_argmax_source(dtype):
    score_weight, sources = random_case(4, 64, (6,), DTYPES[dtype], seed=3)
    out = attnres_aggregate(score_weight * 1e4, sources, 1e-6).float()
    assert torch.isfinite(out).all()
    stacked = torch.stack([s.float() for s in sources])
    logits = torch.rsqrt(stacked.pow(2).mean(-1) + 1e-6) * (stacked @ score_weight)
    expected = stacked.gather(0, logits.argmax(0)[None, :, None].expand(1, 6, 64))[0]
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_op_rejects_sources_of_different_shapes_with_a_clear_message():
    with pytest.raises(ValueError, match="all sources must match"):
        attnres_aggregate(torch.ones(4), [torch.ones(2, 4), torch.ones(3, 4)], 1e-6)


def test_op_rejects_a_score_weight_that_is_not_the_last_dim():
    with pytest.raises(ValueError, match="expected \\[4\\]"):
        attnres_aggregate(torch.ones(5), [torch.ones(2, 4)], 1e-6)


def test_fake_implementation_gives_the_shape_and_dtype_of_source_zero():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        sources = [torch.empty(2, 3, 8, dtype=torch.bfloat16) for _ in range(3)]
        out = torch.ops.attnres.aggregate(torch.empty(8), sources, 1e-6)
    assert out.shape == (2, 3, 8) and out.dtype == torch.bfloat16
