"""An independent NumPy implementation of AttnResLM written from docs/models.md (float64), for checking the model."""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def aggregate(query: np.ndarray, gain: np.ndarray, sources: list[np.ndarray], eps: float) -> np.ndarray:
    logits = np.stack([(rms_norm(v, gain, eps) * query).sum(-1) for v in sources])
    weights = np.exp(logits - logits.max(0))
    weights /= weights.sum(0)
    return sum(w[..., None] * v for w, v in zip(weights, sources, strict=True))


def rope(x: np.ndarray) -> np.ndarray:
    t, hd = x.shape[-2], x.shape[-1]
    freqs = 10000.0 ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(t)[:, None] * freqs[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(x: np.ndarray, sd: dict, i: int, heads: int) -> np.ndarray:
    b, t, d = x.shape
    hd = d // heads

    def proj(name: str) -> np.ndarray:
        return (x @ sd[f"layers.{i}.attn.{name}.weight"].T).reshape(b, t, heads, hd).transpose(0, 2, 1, 3)

    q, k, v = rope(proj("wq")), rope(proj("wk")), proj("wv")
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    s = np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(b, t, d) @ sd[f"layers.{i}.attn.wo.weight"].T


def mlp(x: np.ndarray, sd: dict, i: int) -> np.ndarray:
    a = x @ sd[f"layers.{i}.mlp.w1.weight"].T
    return ((a / (1 + np.exp(-a))) * (x @ sd[f"layers.{i}.mlp.w3.weight"].T)) @ sd[f"layers.{i}.mlp.w2.weight"].T


def forward(sd: dict, cfg: dict, ids: np.ndarray) -> np.ndarray:
    eps, n_layers = cfg["eps"], cfg["n_layers"]
    emb = sd["embed.weight"][ids]
    subs = []
    for i in range(n_layers):
        subs.append(("attn", i))
        subs.append(("mlp", i))

    def run(kind: str, i: int, h: np.ndarray) -> np.ndarray:
        normed = rms_norm(h, sd[f"layers.{i}.{kind}_norm.weight"], eps)
        return attention(normed, sd, i, cfg["n_heads"]) if kind == "attn" else mlp(normed, sd, i)

    if cfg["residual"] == "standard":
        h = emb
        for kind, i in subs:
            h = h + run(kind, i, h)
        x = h
    else:
        size = cfg["block_size"] or 1
        blocks, partial = [emb], None
        for j, (kind, i) in enumerate(subs):
            srcs = blocks if partial is None else [*blocks, partial]
            h = aggregate(sd[f"layers.{i}.{kind}_res.query"], sd[f"layers.{i}.{kind}_res.norm.weight"], srcs, eps)
            u = run(kind, i, h)
            partial = u if partial is None else partial + u
            if (j + 1) % size == 0 or j == len(subs) - 1:
                blocks.append(partial)
                partial = None
        x = aggregate(sd["out_res.query"], sd["out_res.norm.weight"], blocks, eps)
    return rms_norm(x, sd["norm.weight"], eps) @ sd["lm_head.weight"].T
