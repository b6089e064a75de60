"""The dense feed-forward of every family: a gated SiLU MLP with transformers' names, and the seam for MoE layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnres_export.errors import CheckpointError
from attnres_export.models.decoder.config import DecoderConfig


class GatedMLP(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))``; biases only where the config has ``mlp_bias`` (Llama)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def feed_forward(cfg: DecoderConfig, index: int) -> nn.Module:
    """Layer ``index``'s feed-forward: dense, or (where ``cfg.moe_layers`` says so) a mixture of experts, which
    ``decoder/moe.py`` builds from ``cfg.moe``; until it is wired in, an MoE layer is refused."""
    if cfg.is_moe_layer(index):
        raise CheckpointError(f"layer {index} of this {cfg.model_type} model is a mixture-of-experts layer "
                              f"({cfg.moe.num_experts} experts); MoE feed-forwards are not built yet")
    return GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
