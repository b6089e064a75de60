"""The dense feed-forward of every family: a gated SiLU MLP with transformers' names, and the seam for MoE layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnres_export.models.decoder.config import DecoderConfig
from attnres_export.models.decoder.moe import MoEConfig, MoEFeedForward


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
    """Layer ``index``'s feed-forward: dense, or (where ``cfg.moe_layers`` says so) the family's routed mixture of
    experts (``decoder/moe.py``)."""
    if cfg.is_moe_layer(index):
        return MoEFeedForward(moe_config(cfg))
    return GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)


def moe_config(cfg: DecoderConfig) -> MoEConfig:
    """The MoE block settings of ``cfg`` (transformers' keys in ``cfg.moe``): a softmax top-k router (Qwen3-MoE)
    or sigmoid scores with group-limited top-k, a scaling factor and shared experts (DeepSeek-V3)."""
    keys = cfg.moe
    return MoEConfig(hidden_size=cfg.hidden_size, moe_intermediate_size=keys.moe_intermediate_size,
                     num_experts=keys.num_experts, top_k=keys.num_experts_per_tok,
                     router="softmax" if keys.scoring_func == "softmax" else "sigmoid",
                     norm_topk_prob=keys.norm_topk_prob, routed_scaling_factor=keys.routed_scaling_factor,
                     n_group=keys.n_group or 1, topk_group=keys.topk_group or 1,
                     n_shared_experts=keys.n_shared_experts)
