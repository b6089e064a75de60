"""``attnres::kimi_delta_attention``: the gated delta rule of Kimi Delta Attention
(docs/op-set.md#kimideltaattention) as a PyTorch custom op.

The KDA layer (``models/kimi/kda.py``) calls this op once per call, for a prefill of T tokens and for a
single-token step alike, so that an export holds one node per layer. The op takes the recurrent state and
returns the next one; the short convolutions, the gates and the output norm are the layer's, in standard ops.
The reference math lives here and only here: the recurrence itself, token by token, in float32 (float64 when
given float64) from the stored values.
"""

from __future__ import annotations

import torch


def _l2_normalised(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the head dim: eps inside the root, as fla's kernels do."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def kimi_delta_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    scale: float,
    l2norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op: ``(out [B,T,H,dv]`` in q's dtype, ``final_state [B,H,dk,dv]`` in initial_state's dtype)."""
    _check_operands(q, k, v, g, beta, initial_state)
    storage, compute = q.dtype, torch.promote_types(q.dtype, torch.float32)
    q, k, v, g, beta = (t.to(compute) for t in (q, k, v, g, beta))
    q = _l2_normalised(q, l2norm_eps) * scale
    k = _l2_normalised(k, l2norm_eps)
    decay = torch.exp(g)[..., None]                     # [B,T,H,dk,1]
    k_row, v_row, q_row = k[..., None, :], v[..., None, :], q[..., None, :]
    k_beta = (k * beta[..., None])[..., None]           # [B,T,H,dk,1]
    state = initial_state.to(compute)
    outputs = []
    for t in range(q.shape[1]):
        state = state * decay[:, t]
        correction = v_row[:, t] - k_row[:, t] @ state    # v_t - S^T k_t, [B,H,1,dv]
        state = state + k_beta[:, t] @ correction
        outputs.append((q_row[:, t] @ state)[:, :, 0])
    out = torch.stack(outputs, dim=1) if outputs else v.new_zeros(v.shape, dtype=compute)
    return out.to(storage), state.to(initial_state.dtype)


def _check_operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    state: torch.Tensor) -> None:
    if q.dim() != 4 or k.shape != q.shape or g.shape != q.shape:
        raise ValueError(f"KimiDeltaAttention takes q, k, g of one shape [B, T, H, dk], got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, g {tuple(g.shape)}")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3] or beta.shape != q.shape[:3]:
        raise ValueError(f"KimiDeltaAttention v must be [B, T, H, dv] and beta [B, T, H] for q {tuple(q.shape)}, "
                         f"got v {tuple(v.shape)}, beta {tuple(beta.shape)}")
    expected = (q.shape[0], q.shape[2], q.shape[3], v.shape[3])
    if tuple(state.shape) != expected:
        raise ValueError(f"KimiDeltaAttention initial_state is {tuple(state.shape)}, expected {expected}")
    if len({q.dtype, k.dtype, v.dtype, beta.dtype}) != 1:
        raise ValueError(f"KimiDeltaAttention q, k, v, beta must share a dtype, got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}, {beta.dtype}")


@torch.library.custom_op("attnres::kimi_delta_attention", mutates_args=())
def kimi_delta_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    scale: float,
    l2norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over T tokens from ``initial_state``: ``(out, final_state)``."""
    return kimi_delta_attention_reference(q, k, v, g, beta, initial_state, scale, l2norm_eps)


@kimi_delta_attention.register_fake
def _kimi_delta_attention_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    scale: float,
    l2norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return v.new_empty(v.shape), initial_state.new_empty(initial_state.shape)
