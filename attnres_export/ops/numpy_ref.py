"""NumPy reference of the attnres op set: independent of torch, used by ONNX Runtime custom ops."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def attnres_aggregate_numpy(score_weight: np.ndarray, sources: Sequence[np.ndarray], eps: float) -> np.ndarray:
    """docs/op-set.md#attnresaggregate in float32 arithmetic; the result has the sources' dtype."""
    return attnres_aggregate_numpy_in(np.float32, score_weight, sources, eps).astype(sources[0].dtype)


def attnres_aggregate_numpy_in(
    compute_dtype: type, score_weight: np.ndarray, sources: Sequence[np.ndarray], eps: float
) -> np.ndarray:
    """docs/op-set.md#attnresaggregate computed in ``compute_dtype`` (float32 for the op, float64 for error bounds)."""
    stacked = np.stack([np.asarray(s, dtype=compute_dtype) for s in sources], axis=0)
    sw = np.asarray(score_weight, dtype=compute_dtype)
    inv_rms = 1.0 / np.sqrt(np.mean(stacked * stacked, axis=-1) + compute_dtype(eps))
    logits = inv_rms * (stacked @ sw)
    logits = logits - logits.max(axis=0, keepdims=True)
    weights = np.exp(logits)
    weights = weights / weights.sum(axis=0, keepdims=True)
    return (weights[..., None] * stacked).sum(axis=0)


def attnres_aggregate_norm_numpy(score_weight: np.ndarray, norm_weight: np.ndarray, sources: Sequence[np.ndarray],
                                 eps: float, norm_eps: float) -> tuple[np.ndarray, np.ndarray]:
    """docs/op-set.md#attnresaggregatenorm in float32: ``(y, h)`` in the sources' dtype; the norm reads ``h`` as
    stored."""
    h = attnres_aggregate_numpy(score_weight, sources, eps)
    return rms_norm_numpy_in(np.float32, h, norm_weight, norm_eps).astype(h.dtype), h


def rms_norm_numpy_in(compute_dtype: type, h: np.ndarray, norm_weight: np.ndarray, norm_eps: float) -> np.ndarray:
    """``h / sqrt(mean(h^2) + norm_eps) * norm_weight`` computed in ``compute_dtype``."""
    hf = np.asarray(h, dtype=compute_dtype)
    inv_rms = 1.0 / np.sqrt(np.mean(hf * hf, axis=-1, keepdims=True) + compute_dtype(norm_eps))
    return hf * inv_rms * np.asarray(norm_weight, dtype=compute_dtype)


def residual_score_attention_numpy(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    prev_scores: np.ndarray | None,
    mask_bias: np.ndarray | None,
    scale: float,
    logit_divisor: float,
) -> tuple[np.ndarray, np.ndarray]:
    """docs/op-set.md#residualscoreattention in float32: ``out`` in q's dtype, ``scores`` float32 (pre-mask)."""
    out, scores = residual_score_attention_numpy_in(
        np.float32, q, k, v, prev_scores, mask_bias, scale, logit_divisor
    )
    return out.astype(q.dtype), scores


def residual_score_attention_numpy_in(
    compute_dtype: type,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    prev_scores: np.ndarray | None,
    mask_bias: np.ndarray | None,
    scale: float,
    logit_divisor: float,
) -> tuple[np.ndarray, np.ndarray]:
    """docs/models.md#realformer computed in ``compute_dtype`` (float32 for the op, float64 for error bounds)."""
    qf, kf, vf = (np.asarray(t, dtype=compute_dtype) for t in (q, k, v))
    scores = (qf @ np.swapaxes(kf, -1, -2)) * compute_dtype(scale)
    if prev_scores is not None:
        scores = scores + np.asarray(prev_scores, dtype=compute_dtype)
    logits = scores / compute_dtype(logit_divisor)
    if mask_bias is not None:
        logits = logits + np.asarray(mask_bias, dtype=compute_dtype)
    logits = logits - logits.max(axis=-1, keepdims=True)
    weights = np.exp(logits)
    weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights @ vf, scores


def kimi_delta_attention_numpy(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                               initial_state: np.ndarray, scale: float,
                               l2norm_eps: float) -> tuple[np.ndarray, np.ndarray]:
    """docs/op-set.md#kimideltaattention in float32: ``out`` in q's dtype, ``final_state`` float32."""
    out, state = kimi_delta_attention_numpy_in(np.float32, q, k, v, g, beta, initial_state, scale, l2norm_eps)
    return out.astype(q.dtype), state


def kimi_delta_attention_numpy_in(compute_dtype: type, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                                  beta: np.ndarray, initial_state: np.ndarray, scale: float,
                                  l2norm_eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule token by token in ``compute_dtype`` (float32 for the op, float64 for error bounds):
    per batch and head, ``S <- diag(exp(g_t)) S``, ``S <- S + (beta_t k_t) (v_t - S^T k_t)^T``, ``o_t = S^T q_t``
    with q and k L2-normalised over the head dim (eps inside the root) and q scaled."""
    qf, kf, vf, gf, bf = (np.asarray(t, dtype=compute_dtype) for t in (q, k, v, g, beta))
    eps = compute_dtype(l2norm_eps)
    qf = qf / np.sqrt(np.sum(qf * qf, axis=-1, keepdims=True) + eps) * compute_dtype(scale)
    kf = kf / np.sqrt(np.sum(kf * kf, axis=-1, keepdims=True) + eps)
    state = np.array(initial_state, dtype=compute_dtype)
    out = np.zeros(vf.shape, dtype=compute_dtype)
    for t in range(qf.shape[1]):
        state = state * np.exp(gf[:, t])[..., None]
        correction = vf[:, t] - np.einsum("bhk,bhkv->bhv", kf[:, t], state)
        state = state + np.einsum("bhk,bhv->bhkv", bf[:, t, :, None] * kf[:, t], correction)
        out[:, t] = np.einsum("bhk,bhkv->bhv", qf[:, t], state)
    return out, state
