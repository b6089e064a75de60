"""The precision the references compute in: float32 for every storage type, float64 when given float64.

The exported ops and models compute in float32 whatever T is (docs/op-set.md). A model run in float64 must
stay float64 all the way through, because it is the reference that measures how far float32 PyTorch itself is
from exact (docs/parity.md#pass-bars, the depth-scaled bar)."""

from __future__ import annotations

import torch


def at_least_float32(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in float32, or as it is when it is float64."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))
