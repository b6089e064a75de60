"""RMSNorm, the PreNorm of every family (float32 inside, the input dtype out)."""

from __future__ import annotations

import torch
from torch import nn

from attnres_export.ops.aggregate_norm import rms_norm_reference


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` computed in float32, returned in the input dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_reference(x, self.weight, self.eps)
