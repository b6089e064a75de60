"""Kimi K3's feed-forwards (docs/models.md#kimi-k3): the SiTU activation and the latent MoE.

SiTU (``hidden_act`` ``situ``, SGLang ``kimi_k3.py`` ``SituAndMul``): ``beta * tanh(gate / beta) * sigmoid(gate)
* up``, ``up`` first soft-clipped to ``linear_beta * tanh(up / linear_beta)`` when ``linear_beta`` is set, in
float32 and rounded back; it replaces SwiGLU in the dense MLPs, the shared experts and the routed experts.

The latent MoE (``routed_expert_hidden_size``): the router scores the full-width input, the routed experts run on
``routed_expert_down_proj(x)``, their weighted sum is RMS-normalised (``latent_moe_use_norm``) and
``routed_expert_up_proj`` brings it back; the shared experts run on the full-width input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnres_export.models.kimi.lm_config import KimiLinearConfig
from attnres_export.models.layers.mlp import GatedMLP
from attnres_export.models.layers.moe import MoEConfig, MoEFeedForward, SigmoidGroupTopKRouter, StackedExperts
from attnres_export.models.layers.norm import RMSNorm
from attnres_export.ops.precision import at_least_float32


@dataclass(frozen=True)
class Activation:
    """The gated activation of a Kimi feed-forward: SwiGLU (``silu``) or SiTU with its two betas."""

    kind: str = "silu"
    beta: float = 1.0
    linear_beta: float | None = None

    def __call__(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if self.kind == "silu":
            return torch.nn.functional.silu(gate) * up
        wide_gate, wide_up = at_least_float32(gate), at_least_float32(up)
        if self.linear_beta is not None:
            wide_up = self.linear_beta * torch.tanh(wide_up / self.linear_beta)
        situ = self.beta * torch.tanh(wide_gate / self.beta) * torch.sigmoid(wide_gate)
        return (situ * wide_up).to(gate.dtype)

    def fused(self, gate_up: torch.Tensor, dim: int) -> torch.Tensor:
        """Of a fused projection whose first half along ``dim`` is the gate."""
        gate, up = gate_up.chunk(2, dim=dim)
        return self(gate, up)


class KimiMLP(nn.Module):
    """``down_proj(act(gate_proj(x), up_proj(x)))``: a dense layer's MLP or the shared experts."""

    def __init__(self, hidden: int, intermediate: int, activation: Activation) -> None:
        super().__init__()
        self.activation = activation
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activation(self.gate_proj(x), self.up_proj(x)))


class KimiExperts(StackedExperts):
    """The stacked routed experts with the family's activation (every expert path of ``StackedExperts``)."""

    def __init__(self, config: MoEConfig, hidden_size: int, activation: Activation) -> None:
        super().__init__(config, hidden_size)
        self.activation = activation

    def activate(self, gate_up: torch.Tensor, dim: int) -> torch.Tensor:
        return self.activation.fused(gate_up, dim)


class KimiMoE(nn.Module):
    """A Kimi K3 MoE feed-forward, ``forward(x [B, T, D]) -> [B, T, D]``, under the names of ``MoEFeedForward``
    (``gate``, ``experts``, ``shared_experts``) plus the latent projections."""

    def __init__(self, config: MoEConfig, hidden_size: int, activation: Activation, latent_size: int | None,
                 latent_norm: bool, eps: float) -> None:
        super().__init__()
        self.config = config
        self.gate = SigmoidGroupTopKRouter(config, hidden_size)
        width = hidden_size if latent_size is None else latent_size
        self.experts = KimiExperts(config, width, activation)
        self.shared_experts = KimiMLP(hidden_size, config.shared_size, activation) if config.n_shared_experts else None
        if latent_size is not None:
            self.routed_expert_down_proj = nn.Linear(hidden_size, latent_size, bias=False)
            self.routed_expert_up_proj = nn.Linear(latent_size, hidden_size, bias=False)
            self.routed_expert_norm = RMSNorm(latent_size, eps) if latent_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        weights, indices = self.gate(x2)
        if hasattr(self, "routed_expert_down_proj"):
            routed = self.experts(self.routed_expert_down_proj(x2), indices, weights)
            if self.routed_expert_norm is not None:
                routed = self.routed_expert_norm(routed)
            out = self.routed_expert_up_proj(routed)
        else:
            out = self.experts(x2, indices, weights)
        out = out.reshape(x.shape)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


def feed_forward(cfg: KimiLinearConfig, index: int) -> nn.Module:
    """Layer ``index``'s feed-forward: the decoder family's SwiGLU MLP or MoE for a Kimi Linear body, the Kimi
    modules above when K3's SiTU or latent MoE is on."""
    moe = cfg.is_moe_layer(index)
    if cfg.hidden_act == "silu" and cfg.routed_expert_hidden_size is None:
        return MoEFeedForward(cfg.moe, cfg.hidden_size) if moe else GatedMLP(cfg.hidden_size, cfg.intermediate_size,
                                                                              False)
    activation = Activation(cfg.hidden_act, cfg.situ_beta, cfg.situ_linear_beta)
    if moe:
        return KimiMoE(cfg.moe, cfg.hidden_size, activation, cfg.routed_expert_hidden_size, cfg.latent_moe_use_norm,
                       cfg.rms_norm_eps)
    return KimiMLP(cfg.hidden_size, cfg.intermediate_size, activation)
