"""``attnres::aggregate``: one depth aggregation (docs/op-set.md#attnresaggregate) as a PyTorch custom op.

The model calls this op for every aggregation so that the exporter sees one node per aggregation,
whatever the surrounding code looks like. The reference math lives here and only here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnres_export.ops.opset import MAX_SOURCES
from attnres_export.ops.precision import at_least_float32


def attnres_aggregate_reference(
    score_weight: torch.Tensor, sources: Sequence[torch.Tensor], eps: float
) -> torch.Tensor:
    """docs/op-set.md#attnresaggregate in float32 arithmetic; the result has the sources' dtype.

    ``score_weight`` is the folded ``gain * query`` (``[D]``); every source is ``[..., D]``.
    """
    _check_operands(score_weight, sources)
    stacked = torch.stack([at_least_float32(s) for s in sources], dim=0)
    sw = at_least_float32(score_weight)
    inv_rms = torch.rsqrt(stacked.pow(2).mean(dim=-1) + eps)
    logits = inv_rms * (stacked @ sw)
    weights = torch.softmax(logits, dim=0)
    mixed = (weights.unsqueeze(-1) * stacked).sum(dim=0)
    return mixed.to(sources[0].dtype)


def _check_operands(score_weight: torch.Tensor, sources: Sequence[torch.Tensor]) -> None:
    if not 1 <= len(sources) <= MAX_SOURCES:
        raise ValueError(f"AttnResAggregate takes 1..{MAX_SOURCES} sources, got {len(sources)}")
    shape, dtype = sources[0].shape, sources[0].dtype
    for i, s in enumerate(sources):
        if s.shape != shape or s.dtype != dtype:
            raise ValueError(
                f"AttnResAggregate source {i} is {tuple(s.shape)} {s.dtype}, "
                f"source 0 is {tuple(shape)} {dtype}: all sources must match"
            )
    if score_weight.dim() != 1 or score_weight.shape[0] != shape[-1]:
        raise ValueError(
            f"AttnResAggregate score_weight is {tuple(score_weight.shape)}, expected [{shape[-1]}]"
        )


@torch.library.custom_op("attnres::aggregate", mutates_args=())
def attnres_aggregate(score_weight: torch.Tensor, sources: list[torch.Tensor], eps: float) -> torch.Tensor:
    """Softmax-weighted sum of ``sources`` over depth (docs/op-set.md#attnresaggregate)."""
    return attnres_aggregate_reference(score_weight, sources, eps)


@attnres_aggregate.register_fake
def _attnres_aggregate_fake(score_weight: torch.Tensor, sources: list[torch.Tensor], eps: float) -> torch.Tensor:
    return torch.empty_like(sources[0])
