"""Randomly initialised reference checkpoints for examples and tests (random, non-zero
pseudo-queries: with zero ones every aggregation is a plain mean)."""

from __future__ import annotations

import math

import torch
from torch import nn

from attnres_export.models.checkpoint import build_model
from attnres_export.models.config import ModelConfig


def make_example(cfg: ModelConfig, seed: int = 0) -> nn.Module:
    """A model with seeded random weights; aggregation queries and gains are random so no check degenerates.

    Queries are drawn with std ``2/sqrt(D)`` so that logits are O(1): the softmax over depth is neither
    uniform nor one-hot. RealFormer's query and key projections get std ``1.5/sqrt(D)`` for the same reason
    (attention scores of std about 2); LayerNorm gains stay near 1 and biases near 0.
    """
    torch.manual_seed(seed)
    model = build_model(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".query") or name == "query" or name.endswith("_res.query"):
                param.normal_(0.0, 2.0 / math.sqrt(cfg.d_model))
            elif name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name.endswith("norm.bias"):
                param.normal_(0.0, 0.02)
            elif cfg.arch == "realformer" and name.endswith(("attn.wq.weight", "attn.wk.weight")):
                param.normal_(0.0, 1.5 / math.sqrt(cfg.d_model))
    return model.eval()
