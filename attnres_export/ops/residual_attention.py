"""``attnres::residual_score_attention``: one RealFormer attention (docs/op-set.md#residualscoreattention) as a
PyTorch custom op.

The model calls this op for every attention layer so that the exporter sees one node per layer. The op
returns the head outputs and the running sum of raw scores (pre-mask, pre-divisor), which the next layer
takes as ``prev_scores``. The reference math lives here and only here.
"""

from __future__ import annotations

import torch

from attnres_export.ops.precision import at_least_float32


def residual_score_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prev_scores: torch.Tensor | None,
    mask_bias: torch.Tensor | None,
    scale: float,
    logit_divisor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op in float32 arithmetic: ``(out [B,H,Tq,dv]`` in q's dtype, ``scores [B,H,Tq,Tk]`` float32)."""
    _check_operands(q, k, v, prev_scores)
    scores = (at_least_float32(q) @ at_least_float32(k).transpose(-1, -2)) * scale
    if prev_scores is not None:
        scores = scores + at_least_float32(prev_scores)
    logits = scores / logit_divisor
    if mask_bias is not None:
        logits = logits + at_least_float32(mask_bias)
    out = torch.softmax(logits, dim=-1) @ at_least_float32(v)
    return out.to(q.dtype), scores


def _check_operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prev: torch.Tensor | None) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"ResidualScoreAttention takes 4-D q, k, v, got {q.dim()}, {k.dim()}, {v.dim()} dims")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"ResidualScoreAttention q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[:2] != q.shape[:2] or k.shape[-1] != q.shape[-1] or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"ResidualScoreAttention shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    expected = (*q.shape[:3], k.shape[2])
    if prev is not None and tuple(prev.shape) != expected:
        raise ValueError(f"ResidualScoreAttention prev_scores is {tuple(prev.shape)}, expected {expected}")


@torch.library.custom_op("attnres::residual_score_attention", mutates_args=())
def residual_score_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prev_scores: torch.Tensor | None,
    mask_bias: torch.Tensor | None,
    scale: float,
    logit_divisor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with residual scores: ``(out, scores)`` where ``scores = scale*QK^T + prev_scores``."""
    return residual_score_attention_reference(q, k, v, prev_scores, mask_bias, scale, logit_divisor)


@residual_score_attention.register_fake
def _residual_score_attention_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prev_scores: torch.Tensor | None,
    mask_bias: torch.Tensor | None,
    scale: float,
    logit_divisor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    out = q.new_empty((*q.shape[:3], v.shape[-1]))
    scores = q.new_empty((*q.shape[:3], k.shape[2]), dtype=torch.float32)
    return out, scores
