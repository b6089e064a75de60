"""Attention pieces shared by the decoder bodies: the masked float32 softmax attention over grouped keys and the
latent norms' eps. A disallowed score gets float32's lowest finite value, so a row with no key left gives a finite
result instead of NaN."""

from __future__ import annotations

import torch

from attnres_export.ops.precision import at_least_float32

LATENT_NORM_EPS = 1e-6
"""transformers' DeepSeek-V3 builds ``q_a_layernorm`` and ``kv_a_layernorm`` with the RMSNorm default eps, not
``rms_norm_eps``."""


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float) -> torch.Tensor:
    """Softmax attention of ``q [B, H, T, d]`` over ``k [B, Hk, S, d]``, ``v [B, Hk, S, dv]`` (query head
    ``h`` reads key head ``h // (H / Hk)``), float32 result ``[B, H, T, dv]``."""
    b, heads, t, d = q.shape
    groups = heads // k.shape[1]
    qf = at_least_float32(q).view(b, k.shape[1], groups, t, d)
    scores = (qf @ at_least_float32(k).unsqueeze(2).transpose(-1, -2)) * scale
    scores = scores.masked_fill(~allowed.unsqueeze(1), torch.finfo(scores.dtype).min)
    out = scores.softmax(dim=-1) @ at_least_float32(v).unsqueeze(2)
    return out.reshape(b, heads, t, v.shape[-1])
