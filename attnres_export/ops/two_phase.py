"""Two-phase Block AttnRes inference (docs/models.md#two-phase-inference): reference math of a later kernel
optimisation.

Phase 1 attends, once per block, with every query of the block over the completed blocks; phase 2 merges
the block's running partial sum per sublayer. Exact: equal to the direct softmax over all sources.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnres_export.ops.precision import at_least_float32


def _logits(score_weight: torch.Tensor, stacked: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(stacked.pow(2).mean(-1) + eps) * (stacked @ at_least_float32(score_weight))


def phase1(
    score_weights: Sequence[torch.Tensor], blocks: Sequence[torch.Tensor], eps: float
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each query: the softmax-normalised mix ``o_s`` of the completed blocks and its log-sum-exp ``lse_s``."""
    stacked = torch.stack([at_least_float32(b) for b in blocks])
    results = []
    for sw in score_weights:
        logits = _logits(sw, stacked, eps)
        lse = torch.logsumexp(logits, dim=0)
        mixed = (torch.softmax(logits, dim=0).unsqueeze(-1) * stacked).sum(0)
        results.append((mixed, lse))
    return results


def phase2(
    score_weight: torch.Tensor, partial: torch.Tensor, mixed: torch.Tensor, lse: torch.Tensor, eps: float
) -> torch.Tensor:
    """``h = o + sigmoid(s2 - lse) * (p - o)`` with ``s2`` the partial sum's logit (float32)."""
    p = at_least_float32(partial)
    s2 = _logits(score_weight, p.unsqueeze(0), eps)[0]
    gate = torch.sigmoid(s2 - lse).unsqueeze(-1)
    return mixed + gate * (p - mixed)
