"""Randomly initialised reference checkpoints for examples and tests (random, non-zero pseudo-queries: with zero
ones every aggregation is a plain mean); each family says how in its ``init_example``."""

from __future__ import annotations

import torch
from torch import nn

from attnres_export.models.registry import build_model


def make_example(cfg, seed: int = 0) -> nn.Module:
    """A model of ``cfg`` with seeded random weights, none of them degenerate for a check."""
    torch.manual_seed(seed)
    model = build_model(cfg)
    model.init_example()
    return model.eval()
