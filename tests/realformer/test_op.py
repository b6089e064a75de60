"""``attnres::residual_score_attention`` computes docs/op-set.md in float32 in every storage dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnres_export.ops import residual_score_attention, residual_score_attention_numpy_in

SHAPES = [  # B, H, Tq, Tk, dh, dv
    (2, 3, 5, 7, 8, 8),
    (1, 2, 1, 9, 5, 3),  # single query, odd head size, dv != dh
    (3, 1, 4, 4, 7, 7),
]
BOUNDS = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _operands(shape, dtype, prev: bool, mask: bool, seed: int = 0):
    b, h, tq, tk, dh, dv = shape
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, h, n, dh, generator=g).to(dtype) for n in (tq, tk))
    v = torch.randn(b, h, tk, dv, generator=g).to(dtype)
    prev_scores = torch.randn(b, h, tq, tk, generator=g) if prev else None
    mask_bias = None
    if mask:
        mask_bias = torch.zeros(b, 1, 1, tk)
        mask_bias[0, ..., tk // 2:] = -10000.0
    return q, k, v, prev_scores, mask_bias


def _float64(q, k, v, prev, mask, scale, divisor):
    arrays = [None if t is None else t.double().numpy() for t in (q, k, v, prev, mask)]
    return residual_score_attention_numpy_in(np.float64, *arrays, scale, divisor)


@pytest.mark.parametrize("dtype", list(BOUNDS), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(("prev", "mask"), [(False, False), (True, False), (False, True), (True, True)])
def test_op_matches_float64_reference_from_the_storage_values(shape, dtype, prev, mask) -> None:
    q, k, v, p, m = _operands(shape, dtype, prev, mask)
    scale, divisor = shape[4] ** -0.5, 3.0 if prev else 1.0
    out, scores = residual_score_attention(q, k, v, p, m, scale, divisor)
    ref_out, ref_scores = _float64(q, k, v, p, m, scale, divisor)
    assert out.dtype == dtype and out.shape == (*shape[:3], shape[5])
    assert scores.dtype == torch.float32 and scores.shape == shape[:4]
    np.testing.assert_allclose(scores.numpy(), ref_scores, rtol=1e-5, atol=1e-5)
    bound = BOUNDS[dtype]
    np.testing.assert_allclose(out.float().numpy(), ref_out, rtol=bound, atol=bound)


def test_float32_op_matches_float64_to_about_1e_6_relative() -> None:
    q, k, v, p, m = _operands((2, 4, 8, 8, 16, 16), torch.float32, True, True, seed=7)
    out, _ = residual_score_attention(q, k, v, p, m, 0.25, 2.0)
    ref, _ = _float64(q, k, v, p, m, 0.25, 2.0)
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 2e-6


def test_scores_are_pre_mask_and_pre_divisor() -> None:
    q, k, v, p, m = _operands((1, 2, 3, 6, 4, 4), torch.float32, True, True)
    _, scores = residual_score_attention(q, k, v, p, m, 0.5, 4.0)
    expected = (q @ k.transpose(-1, -2)) * 0.5 + p
    torch.testing.assert_close(scores, expected, rtol=1e-6, atol=1e-6)


def test_masked_keys_get_no_weight() -> None:
    """With values that are large only at masked keys, the output stays small."""
    q, k, v, _, m = _operands((1, 1, 4, 6, 4, 4), torch.float32, False, True)
    v[..., 3:, :] = 1e6
    out, _ = residual_score_attention(q, k, v, None, m, 0.5, 1.0)
    assert out.abs().max() < 100.0


def test_op_passes_torch_library_opcheck_with_and_without_optional_inputs() -> None:
    for prev, mask in [(False, False), (True, True), (False, True)]:
        q, k, v, p, m = _operands((2, 2, 3, 5, 4, 6), torch.float32, prev, mask)
        torch.library.opcheck(torch.ops.attnres.residual_score_attention.default, (q, k, v, p, m, 0.5, 2.0),
                              test_utils=("test_schema", "test_faketensor"))


def test_op_refuses_prev_scores_of_the_wrong_shape() -> None:
    q, k, v, _, _ = _operands((1, 1, 3, 5, 4, 4), torch.float32, False, False)
    with pytest.raises(ValueError, match="prev_scores"):
        residual_score_attention(q, k, v, torch.zeros(1, 1, 5, 3), None, 0.5, 1.0)
