"""The attention sublayers: grouped-query attention (Llama, Qwen2, Qwen3) and DeepSeek-V3 multi-head latent attention.

Both take the new tokens, their rotary cos/sin, a boolean ``allowed [B|1, 1, T, P+T]`` mask and the cached
state of the earlier tokens (or none; it is read in the weights' type, so a float32 cache feeds a half model),
and return the output and the state to cache, in the weights' type: grouped keys and values at
``num_key_value_heads`` (never expanded to every query head), or for latent attention the normalized compressed
latent and the rotary key, the two things vLLM and SGLang cache. Scores and softmax are float32; a disallowed
score gets float32's lowest finite value, so a row with no key left gives a finite result instead of NaN.
"""

from __future__ import annotations

import torch
from torch import nn

from attnres_export.models.decoder.config import DecoderConfig
from attnres_export.models.decoder.hf_config import yarn_mscale
from attnres_export.models.decoder.rope import rotate
from attnres_export.models.layers.attention import LATENT_NORM_EPS, attend
from attnres_export.models.layers.latent_attention import latent_attend
from attnres_export.models.layers.norm import RMSNorm


class GroupedQueryAttention(nn.Module):
    """``q_proj``/``k_proj``/``v_proj``/``o_proj`` with ``num_key_value_heads`` key/value heads, optional biases
    and (Qwen3) per-head RMSNorm of queries and keys before rotary."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(d, self.heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, self.kv_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, self.kv_heads * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.heads * hd, d, bias=cfg.o_proj_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, allowed: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Output ``[B, T, D]`` and the keys (after rotary) and values ``[B, Hk, P+T, hd]``."""
        b, t, _ = x.shape

        def heads(proj: nn.Linear, n: int, norm: RMSNorm | None) -> torch.Tensor:
            y = proj(x).view(b, t, n, self.head_dim)
            return (y if norm is None else norm(y)).transpose(1, 2)

        q = rotate(heads(self.q_proj, self.heads, self.q_norm if self.qk_norm else None), cos, sin)
        k = rotate(heads(self.k_proj, self.kv_heads, self.k_norm if self.qk_norm else None), cos, sin)
        v = heads(self.v_proj, self.kv_heads, None)
        if past is not None:
            k, v = torch.cat([past[0].to(k.dtype), k], dim=2), torch.cat([past[1].to(v.dtype), v], dim=2)
        out = attend(q, k, v, allowed, self.head_dim**-0.5).to(x.dtype)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)), (k, v)


class LatentAttention(nn.Module):
    """DeepSeek-V3 multi-head latent attention with transformers' module names: queries through ``q_proj`` or
    ``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj``; ``kv_a_proj_with_mqa`` gives the compressed latent
    (normalized by ``kv_a_layernorm``) and one rotary key shared by all heads; ``kv_b_proj`` expands the latent
    into every head's non-rotary key and value. Softmax scale ``qk_head_dim^-0.5``, times ``mscale^2`` for yarn
    rope with ``mscale_all_dim`` (``mscale = 0.1 * mscale_all_dim * ln(factor) + 1``)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        mla, d = cfg.mla, cfg.hidden_size
        self.mla, self.heads = mla, cfg.num_attention_heads
        bias = cfg.o_proj_bias
        if mla.q_lora_rank is None:
            self.q_proj = nn.Linear(d, self.heads * mla.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(d, mla.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(mla.q_lora_rank, self.heads * mla.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, mla.kv_lora_rank + mla.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(mla.kv_lora_rank, self.heads * (mla.qk_nope_head_dim + mla.v_head_dim), bias=False)
        self.o_proj = nn.Linear(self.heads * mla.v_head_dim, d, bias=bias)
        self.scale = mla.qk_head_dim**-0.5
        rope = cfg.rope
        if rope.rope_type == "yarn" and rope.mscale_all_dim:
            self.scale *= yarn_mscale(rope.factor, rope.mscale_all_dim) ** 2

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, allowed: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Output ``[B, T, D]`` and the latent ``[B, P+T, kv_lora_rank]`` and rotary key ``[B, P+T, rope]``."""
        mla, h = self.mla, self.heads
        b, t, _ = x.shape
        q = self.q_proj(x) if mla.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_pass, q_rot = q.view(b, t, h, mla.qk_head_dim).transpose(1, 2).split(
            [mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1)
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([mla.kv_lora_rank, mla.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)
        q_rot = rotate(q_rot, cos, sin, mla.rope_interleave)
        k_rot = rotate(k_rot.unsqueeze(1), cos, sin, mla.rope_interleave).squeeze(1)
        if past is not None:
            latent = torch.cat([past[0].to(latent.dtype), latent], dim=1)
            k_rot = torch.cat([past[1].to(k_rot.dtype), k_rot], dim=1)
        out = latent_attend(torch.cat([q_pass, q_rot], dim=-1), latent, k_rot, self.kv_b_proj.weight,
                            mla.qk_nope_head_dim, mla.v_head_dim, allowed, self.scale, past is not None).to(x.dtype)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * mla.v_head_dim)), (latent, k_rot)
