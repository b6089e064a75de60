"""``NopeLatentAttention``: Kimi Linear's full-attention layer, transformers 5.23's ``KimiLinearAttention``.

DeepSeek-V3's multi-head latent attention without any rotary embedding ("MLA with NoPE"): the
``qk_rope_head_dim`` part of the keys is still one projection shared by every head, but unrotated, so the cache
holds the normalized latent ``[B, S, kv_lora_rank]`` and that shared key part ``[B, S, qk_rope_head_dim]`` as
they are, and no position enters the layer (the causal mask orders the tokens).
"""

from __future__ import annotations

import torch
from torch import nn

from attnres_export.models.kimi.lm_config import KimiLinearConfig
from attnres_export.models.layers.attention import LATENT_NORM_EPS
from attnres_export.models.layers.latent_attention import latent_attend
from attnres_export.models.layers.norm import RMSNorm


class NopeLatentAttention(nn.Module):
    """transformers' module names: ``q_proj`` (or ``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj``),
    ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``; softmax scale ``qk_head_dim^-0.5``.
    With K3's ``mla_use_output_gate`` the heads' output is multiplied by ``sigmoid(g_proj(x))`` before ``o_proj``
    (SGLang ``KimiK3MLAAttention``: ``x * torch.sigmoid(gate)`` of the layer input's gate)."""

    def __init__(self, cfg: KimiLinearConfig) -> None:
        super().__init__()
        d, h, bias = cfg.hidden_size, cfg.num_attention_heads, cfg.attention_bias
        self.cfg, self.heads = cfg, h
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(d, h * cfg.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(d, cfg.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, h * cfg.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, h * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        if cfg.mla_use_output_gate:
            self.g_proj = nn.Linear(d, h * cfg.v_head_dim, bias=False)
        self.o_proj = nn.Linear(h * cfg.v_head_dim, d, bias=bias)
        self.scale = cfg.qk_head_dim**-0.5

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``x [B, T, D]``, ``allowed [B|1, 1, T, P+T]`` -> output ``[B, T, D]`` and the latent
        ``[B, P+T, kv_lora_rank]`` and shared key part ``[B, P+T, qk_rope_head_dim]``."""
        cfg, h = self.cfg, self.heads
        b, t, _ = x.shape
        q = self.q_proj(x) if cfg.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(b, t, h, cfg.qk_head_dim).transpose(1, 2)
        latent, k_shared = self.kv_a_proj_with_mqa(x).split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)
        if past is not None:
            latent = torch.cat([past[0].to(latent.dtype), latent], dim=1)
            k_shared = torch.cat([past[1].to(k_shared.dtype), k_shared], dim=1)
        out = latent_attend(q, latent, k_shared, self.kv_b_proj.weight, cfg.qk_nope_head_dim, cfg.v_head_dim, allowed,
                            self.scale, past is not None).to(x.dtype).transpose(1, 2).reshape(b, t, h * cfg.v_head_dim)
        if cfg.mla_use_output_gate:
            out = out * torch.sigmoid(self.g_proj(x))
        return self.o_proj(out), (latent, k_shared)
