"""In-memory stored tensors for the quantized readers' tests."""

from __future__ import annotations

import torch

from attnres_export.models.store.tensors import StoredTensor


def stored(tensors: dict[str, torch.Tensor]) -> dict[str, StoredTensor]:
    """Each tensor as a ``StoredTensor`` read from memory."""
    return {name: StoredTensor(value.shape, value.dtype, lambda value=value: value, f"memory: {name}")
            for name, value in tensors.items()}


def prefixed(prefix: str, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"{prefix}.{name}": value for name, value in parts.items()}
