"""transformers 5.23's ``KimiLinearDeltaAttention`` at random init, and our layer holding the same weights: the
independent reference of every KDA test."""

from __future__ import annotations

import numpy as np
import torch
from transformers import KimiLinearConfig
from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

from attnres_export.models.kimi import KdaConfig, KimiDeltaAttention, state_dict_from_transformers

HIDDEN = 24
LINEAR_ATTN = {"head_dim": 8, "num_heads": 3, "short_conv_kernel_size": 4, "kda_layers": [1, 3],
               "full_attn_layers": [2]}
"""Tiny sizes; transformers' prefill runs its chunked form (chunks of 64), so T > 64 covers a second chunk."""

CONFIG_JSON = {"hidden_size": HIDDEN, "num_hidden_layers": 3, "rms_norm_eps": 1e-5, "hidden_act": "silu",
               "linear_attn_config": LINEAR_ATTN, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
               "vocab_size": 32}


def transformers_layer(seed: int = 0, dtype: torch.dtype = torch.float32) -> KimiLinearDeltaAttention:
    """Every parameter drawn at random (transformers leaves A_log and dt_bias uninitialised in a bare layer)."""
    layer = KimiLinearDeltaAttention(KimiLinearConfig(**CONFIG_JSON), layer_idx=0)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.4)
        layer.forget_gate.A_log.copy_(torch.log(torch.rand(layer.forget_gate.A_log.shape, generator=gen) * 15 + 1))
        layer.o_norm.weight.add_(1.0)
    return layer.to(dtype).eval()


def our_layer(reference: KimiLinearDeltaAttention) -> KimiDeltaAttention:
    layer = KimiDeltaAttention(KdaConfig.from_hf(CONFIG_JSON))
    layer.load_state_dict(state_dict_from_transformers(reference.state_dict()))
    return layer.to(reference.q_proj.weight.dtype).eval()


def hidden(batch: int, tokens: int, seed: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(batch, tokens, HIDDEN, generator=torch.Generator().manual_seed(seed)).to(dtype)


def rel_l2(got: torch.Tensor | np.ndarray, want: torch.Tensor | np.ndarray) -> float:
    got_, want_ = (np.asarray(x.detach().double() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
                   for x in (got, want))
    return float(np.linalg.norm(got_ - want_) / np.linalg.norm(want_))
