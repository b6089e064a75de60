"""An independent NumPy RealFormer written from docs/models.md#realformer (float64), sharing no code with it."""

from __future__ import annotations

import math

import numpy as np


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def gelu(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def realformer_numpy(
    state: dict[str, np.ndarray],
    cfg: dict,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    carry_masked: bool = False,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """``hidden [B,T,D]`` and the carried ``R_l`` per layer.

    ``carry_masked`` builds the wrong model that carries the masked logits, to show the tests can tell.
    """
    w = {k: np.asarray(v, dtype=np.float64) for k, v in state.items()}
    b, t = input_ids.shape
    d, h = cfg["d_model"], cfg["n_heads"]
    dh = d // h
    eps = cfg["eps"]

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    def split(x: np.ndarray) -> np.ndarray:
        return x.reshape(b, t, h, dh).transpose(0, 2, 1, 3)

    x = w["embed.tok.weight"][input_ids] + w["embed.pos.weight"][:t]
    x = layer_norm(x, w["embed.norm.weight"], w["embed.norm.bias"], eps)
    bias = np.where(attention_mask == 0, -10000.0, 0.0)[:, None, None, :]
    running = None
    carried = []
    for i in range(cfg["n_layers"]):
        p = f"layers.{i}"
        q, k, v = (split(linear(x, f"{p}.attn.{n}")) for n in ("wq", "wk", "wv"))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh)
        r = s if running is None else s + running
        logits = r / (i + 1) if cfg["running_mean"] else r
        logits = logits + bias
        running = logits if carry_masked else r
        carried.append(r)
        o = (softmax(logits) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = layer_norm(x + linear(o, f"{p}.attn.wo"), w[f"{p}.attn_norm.weight"], w[f"{p}.attn_norm.bias"], eps)
        f = linear(gelu(linear(x, f"{p}.ffn.w1")), f"{p}.ffn.w2")
        x = layer_norm(x + f, w[f"{p}.ffn_norm.weight"], w[f"{p}.ffn_norm.bias"], eps)
    return x, carried
