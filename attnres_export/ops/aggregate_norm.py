"""``attnres::aggregate_norm``: a depth aggregation followed by the RMSNorm that reads it, as one PyTorch custom op
(docs/op-set.md#attnresaggregatenorm).

Every AttnRes sublayer normalizes its aggregated input before its function, so a runtime that fuses the two
reads the sources once and never writes the aggregate. The math is exactly the unfused pair's: the aggregate is
rounded to the storage type first, as ``AttnResAggregate`` writes it, and the norm starts from that value.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnres_export.ops.aggregate import attnres_aggregate_reference
from attnres_export.ops.precision import at_least_float32


def rms_norm_reference(h: torch.Tensor, norm_weight: torch.Tensor, norm_eps: float) -> torch.Tensor:
    """``h / sqrt(mean(h^2) + norm_eps) * norm_weight`` in float32 from the stored ``h``; the result has h's dtype."""
    hf = at_least_float32(h)
    normed = hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + norm_eps)
    return (normed * at_least_float32(norm_weight)).to(h.dtype)


def attnres_aggregate_norm_reference(score_weight: torch.Tensor, norm_weight: torch.Tensor,
                                     sources: Sequence[torch.Tensor], eps: float, norm_eps: float
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, h)``: the normalized aggregate and the aggregate itself, both in the sources' dtype."""
    h = attnres_aggregate_reference(score_weight, sources, eps)
    if norm_weight.dim() != 1 or norm_weight.shape[0] != h.shape[-1]:
        raise ValueError(f"AttnResAggregateNorm norm_weight is {tuple(norm_weight.shape)}, expected [{h.shape[-1]}]")
    return rms_norm_reference(h, norm_weight, norm_eps), h


@torch.library.custom_op("attnres::aggregate_norm", mutates_args=())
def attnres_aggregate_norm(score_weight: torch.Tensor, norm_weight: torch.Tensor, sources: list[torch.Tensor],
                           eps: float, norm_eps: float) -> torch.Tensor:
    """RMSNorm of the depth aggregation of ``sources`` (docs/op-set.md#attnresaggregatenorm); only ``y``, because
    no model in scope reads the aggregate after its norm."""
    return attnres_aggregate_norm_reference(score_weight, norm_weight, sources, eps, norm_eps)[0]


@attnres_aggregate_norm.register_fake
def _attnres_aggregate_norm_fake(score_weight: torch.Tensor, norm_weight: torch.Tensor, sources: list[torch.Tensor],
                                 eps: float, norm_eps: float) -> torch.Tensor:
    return torch.empty_like(sources[0])
