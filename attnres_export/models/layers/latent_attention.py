"""The attention core of multi-head latent attention (DeepSeek-V3's MLA, Kimi's NoPE MLA) over a cached latent, in
the cheaper of its two exact forms for the number of queries.

The cache holds the normalized latent ``c [B, S, r]`` and one key part shared by every head ``k_s [B, S, rho]``;
``kv_b_proj`` (weight ``[H * (n + v), r]``) expands the latent into each head's key part ``k_n = c W_k^T`` and value
``v = c W_v^T``. Two forms compute the same attention:

- ``expanded`` (transformers' form): expand every cached position, then attend. Per head and sequence it costs
  ``S r (n + v)`` to expand plus ``T S (n + rho + v)`` to attend: the expansion is paid again at every decode step.
- ``absorbed`` (the DeepSeek-V2 paper's weight absorption, arXiv:2405.04434; vLLM's "data-movement friendly"
  decode path, ``vllm/v1/attention/backends/mla/common.py``): fold ``W_k`` into the queries and ``W_v`` after the
  weighted sum, ``softmax((q_n W_k) c^T + q_s k_s^T) c W_v^T``, attending over the latent itself. It costs
  ``T S (2 r + rho)`` plus ``T r (n + v)``: nothing that grows with ``S`` is expanded.

The absorbed form is cheaper while ``T (2 r - n - v) < r (n + v)``: always for a decode step, and for prompts up
to ``absorbed_max_queries`` tokens (170 at DeepSeek-V3's widths, 128 at the benchmarks'). A with-past export holds
both as an ONNX ``If`` on the query count (``torch.cond``, as the experts' forms, models/layers/moe.py); eager
PyTorch takes the same branch in Python. Both return float32, as ``attend``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnres_export.models.layers.attention import attend
from attnres_export.ops.precision import at_least_float32


def absorbed_max_queries(rank: int, nope: int, v_dim: int) -> int:
    """The most queries for which the absorbed form costs no more multiply-adds than the expanded one."""
    extra_per_query = 2 * rank - nope - v_dim
    return 2**31 - 1 if extra_per_query <= 0 else rank * (nope + v_dim) // extra_per_query


def latent_attend(q: torch.Tensor, latent: torch.Tensor, k_shared: torch.Tensor, kv_b_weight: torch.Tensor,
                  nope: int, v_dim: int, allowed: torch.Tensor, scale: float, cached: bool) -> torch.Tensor:
    """``q [B, H, T, n + rho]`` (the head's own key part first) over ``latent [B, S, r]`` and ``k_shared
    [B, S, rho]``, ``allowed [B|1, 1, T, S]``: float32 ``[B, H, T, v]``. Without a cache (``cached`` false: a whole
    sequence, the graph without past) the expanded form is kept: that graph serves prompts, not decode steps."""
    queries = q.shape[2]
    few = cached and queries <= absorbed_max_queries(latent.shape[-1], nope, v_dim)
    operands = (q, latent, k_shared, kv_b_weight, allowed)
    if isinstance(few, torch.SymBool):
        return torch.cond(few, absorbed_form(nope, v_dim, scale), expanded_form(nope, v_dim, scale), operands)
    return (absorbed_form if few else expanded_form)(nope, v_dim, scale)(*operands)


def expanded_form(nope: int, v_dim: int, scale: float):
    """transformers' form, as a function of the operands alone (``torch.cond`` takes branches of tensors only)."""
    def expanded(q: torch.Tensor, latent: torch.Tensor, k_shared: torch.Tensor, kv_b_weight: torch.Tensor,
                 allowed: torch.Tensor) -> torch.Tensor:
        b, heads, _, _ = q.shape
        s = latent.shape[1]
        k_nope, v = F.linear(latent, kv_b_weight).view(b, s, heads, nope + v_dim).transpose(1, 2).split(
            [nope, v_dim], dim=-1)
        k = torch.cat([k_nope, k_shared.unsqueeze(1).expand(b, heads, s, k_shared.shape[-1])], dim=-1)
        return attend(q, k, v, allowed, scale)
    return expanded


def absorbed_form(nope: int, v_dim: int, scale: float):
    """The absorbed form, as a function of the operands alone; float32 throughout, as ``attend`` computes."""
    def absorbed(q: torch.Tensor, latent: torch.Tensor, k_shared: torch.Tensor, kv_b_weight: torch.Tensor,
                 allowed: torch.Tensor) -> torch.Tensor:
        heads = q.shape[1]
        w_k, w_v = at_least_float32(kv_b_weight).view(heads, nope + v_dim, -1).split([nope, v_dim], dim=1)
        q_nope, q_shared = at_least_float32(q).split([nope, q.shape[-1] - nope], dim=-1)
        c = at_least_float32(latent).unsqueeze(1)
        scores = (q_nope @ w_k) @ c.transpose(-1, -2) + q_shared @ at_least_float32(k_shared).unsqueeze(1).transpose(
            -1, -2)
        scores = (scores * scale).masked_fill(~allowed, torch.finfo(scores.dtype).min)
        return (scores.softmax(dim=-1) @ c) @ w_v.transpose(-1, -2)
    return absorbed
