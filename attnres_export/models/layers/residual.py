"""Attention Residuals with Kimi K3's names and semantics, on any decoder body (docs/models.md#k3-attention-residuals).

A K3 aggregation site is a pair of sibling modules: ``<site>_res_norm`` (an RMSNorm weight ``[D]``, the key-norm
gain ``g``) and ``<site>_res_proj`` (a ``Linear(D, 1)`` weight ``[1, D]``, the pseudo-query ``w``). Each
candidate source is scored ``proj(RMSNorm(v))`` = ``(g * w) . v / RMS(v)``, so the site is exactly one
``attnres::aggregate`` with ``score_weight = g * w`` folded in float32 and ``eps = rms_norm_eps``. The sublayer's
own PreNorm reads the aggregate; with ``fused`` the two run as one ``attnres::aggregate_norm``.
"""

from __future__ import annotations

import torch
from torch import nn

from attnres_export.models.base import KeepFloat32
from attnres_export.models.layers.norm import RMSNorm
from attnres_export.ops.aggregate import attnres_aggregate
from attnres_export.ops.aggregate_norm import attnres_aggregate_norm
from attnres_export.ops.precision import at_least_float32


class ResidualNorm(KeepFloat32):
    """``<site>_res_norm``: the gain ``g`` and the eps of a site's key norm (kept float32 under dtype casts)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))


class ResidualProjection(KeepFloat32):
    """``<site>_res_proj``: the pseudo-query row ``[1, D]`` (kept float32), and the folded score weight while
    ``CausalLM.score_weights_folded()`` is active."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, dim))
        self.register_buffer("score_weight", None, persistent=False)

    def compute_score_weight(self, norm: ResidualNorm) -> torch.Tensor:
        """``g * w`` in float32 (float64 when the model is)."""
        return at_least_float32(norm.weight) * at_least_float32(self.weight[0])

    def fold(self, norm: ResidualNorm) -> None:
        self.score_weight = self.compute_score_weight(norm).detach().clone()


def aggregate(norm: ResidualNorm, proj: ResidualProjection, sources: list[torch.Tensor], prenorm: RMSNorm,
              fused: bool) -> torch.Tensor:
    """``prenorm(aggregate(sources))`` for one site: one ``attnres::aggregate`` then the RMSNorm, or with
    ``fused`` one ``attnres::aggregate_norm`` (the same math)."""
    score_weight = proj.score_weight if proj.score_weight is not None else proj.compute_score_weight(norm)
    if fused:
        return attnres_aggregate_norm(score_weight, at_least_float32(prenorm.weight), sources, norm.eps, prenorm.eps)
    return prenorm(attnres_aggregate(score_weight, sources, norm.eps))
