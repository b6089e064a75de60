"""The feed-forward seam of ``DecoderLM``: a dense ``GatedMLP`` or a routed MoE per layer (``layers/``)."""

from __future__ import annotations

from torch import nn

from attnres_export.models.decoder.config import DecoderConfig
from attnres_export.models.layers.mlp import GatedMLP
from attnres_export.models.layers.moe import MoEFeedForward


def feed_forward(cfg: DecoderConfig, index: int) -> nn.Module:
    """Layer ``index``'s feed-forward: dense, or (where ``cfg.moe_layers`` says so) the family's routed mixture of
    experts (``layers/moe.py``)."""
    if cfg.is_moe_layer(index):
        return MoEFeedForward(cfg.moe, cfg.hidden_size)
    return GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)

