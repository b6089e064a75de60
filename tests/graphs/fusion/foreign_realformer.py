"""RealFormer encoders written the way other codebases write them, so residual-score fusion is tested on graphs we
did not design (docs/fusion.md#residual-attention-scores).

Each is a tiny Post-LN encoder (token + position embedding, ``LAYERS`` layers of attention and MLP) whose attention
layers differ only in how the scores are written. ``residual_layers`` is how many attention layers carry residual
scores (0 for the plain and near-miss models).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tests.graphs.fusion.foreign_models import VOCAB

DIM, HEADS, LAYERS, MAX_SEQ = 32, 4, 3, 64
VIT_LAYERS, IMAGE = 4, 16
PAD = 0
"""Token id of padding: the masked models derive their additive mask from it (as BERT tokenizers do)."""


class Encoder(nn.Module):
    """Embeddings, ``LAYERS`` Post-LN layers and the attention plumbing; subclasses write
    ``attend(q, k, v, prev, mask, layer) -> (out, carried)``, ``carried`` being the next layer's ``prev``."""

    residual_layers = LAYERS

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.head_dim = DIM // HEADS
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(MAX_SEQ, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.qkv = nn.ModuleList(nn.Linear(DIM, 3 * DIM) for _ in range(LAYERS))
        for proj in self.qkv:
            nn.init.normal_(proj.weight, std=1.5 / math.sqrt(DIM))
        self.wo = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(LAYERS))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
                                 for _ in range(LAYERS))
        self.norms = nn.ModuleList(nn.LayerNorm(DIM) for _ in range(2 * LAYERS))

    def mask_bias(self, input_ids: torch.Tensor) -> torch.Tensor | None:
        return None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        b, t = input_ids.shape
        x = self.norm(self.tok(input_ids) + self.pos.weight[:t])
        mask, prev = self.mask_bias(input_ids), None
        for i in range(LAYERS):
            q, k, v = (part.view(b, t, HEADS, self.head_dim).transpose(1, 2) for part in self.qkv[i](x).chunk(3, -1))
            out, prev = self.attend(q, k, v, prev, mask, i)
            x = self.norms[2 * i](x + self.wo[i](out.transpose(1, 2).reshape(b, t, DIM)))
            x = self.norms[2 * i + 1](x + self.mlp[i](x))
        return x


class PaddingMask:
    """BERT's additive padding bias ``[B, 1, 1, T]``: -10000 at padding keys, 0 elsewhere."""

    def mask_bias(self, input_ids: torch.Tensor) -> torch.Tensor:
        keep = (input_ids != PAD).to(self.tok.weight.dtype)
        return ((1.0 - keep) * -10000.0)[:, None, None, :]


class BertStyleRealFormer(PaddingMask, Encoder):
    """(a) ``q @ k.transpose(-1, -2) * scale + prev``, then the padding bias and ``F.softmax``; ``prev`` passed on."""

    def attend(self, q, k, v, prev, mask, layer):
        scores = q @ k.transpose(-1, -2) * self.head_dim**-0.5
        if prev is not None:
            scores = scores + prev
        probs = F.softmax(scores + mask, dim=-1)
        return probs @ v, scores


class RunningMeanRealFormer(Encoder):
    """(b) ``torch.matmul`` over ``math.sqrt(dh)``, ``prev + scores`` (other operand order), no mask, and the
    running mean: the carried sum is divided by ``layer + 1`` before ``torch.softmax``."""

    def attend(self, q, k, v, prev, mask, layer):
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        if prev is not None:
            scores = prev + scores
        weights = torch.softmax(scores / (layer + 1), dim=-1)
        return torch.matmul(weights, v), scores


class PlainBert(PaddingMask, Encoder):
    """Ordinary attention: nothing is carried between layers (every softmax is plain attention)."""

    residual_layers = 0

    def attend(self, q, k, v, prev, mask, layer):
        scores = q @ k.transpose(-1, -2) * self.head_dim**-0.5
        return F.softmax(scores + mask, dim=-1) @ v, scores


class ScoresAfterSoftmax(PaddingMask, Encoder):
    """Near miss: the previous layer's scores are added to the probabilities, after the softmax."""

    residual_layers = 0

    def attend(self, q, k, v, prev, mask, layer):
        scores = q @ k.transpose(-1, -2) * self.head_dim**-0.5
        probs = F.softmax(scores + mask, dim=-1)
        if prev is not None:
            probs = probs + 0.1 * prev
        return probs @ v, scores


class MultipliedScores(Encoder):
    """Near miss: the previous layer's scores multiply the new ones instead of adding to them."""

    residual_layers = 0

    def attend(self, q, k, v, prev, mask, layer):
        scores = q @ k.transpose(-1, -2) * self.head_dim**-0.5
        if prev is not None:
            scores = scores * prev
        return F.softmax(scores, dim=-1) @ v, scores


class CarriedMask(PaddingMask, Encoder):
    """Near miss: the padding bias is added before the scores are carried, so it accumulates over the layers."""

    residual_layers = 0

    def attend(self, q, k, v, prev, mask, layer):
        scores = q @ k.transpose(-1, -2) * self.head_dim**-0.5 + mask
        if prev is not None:
            scores = scores + prev
        return F.softmax(scores, dim=-1) @ v, scores


class EinsumRealFormer(PaddingMask, Encoder):
    """(c) ``torch.einsum`` for both products, the scale folded into the queries first."""

    def attend(self, q, k, v, prev, mask, layer):
        scores = torch.einsum("bhqd,bhkd->bhqk", q * self.head_dim**-0.5, k)
        if prev is not None:
            scores = scores + prev
        probs = (scores + mask).softmax(-1)
        return torch.einsum("bhqk,bhkd->bhqd", probs, v), scores


class BmmRealFormerViT(nn.Module):
    """(d) A RealFormer vision transformer: a patch embedding, a class token, ``VIT_LAYERS`` pre-norm blocks, the
    heads merged into the batch (``[B*H, N, d]``) for ``torch.bmm``, and the scores carried layer to layer; it
    classifies from the class token."""

    def __init__(self, seed: int = 0, patch: int = 4, classes: int = 10) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.head_dim = DIM // HEADS
        self.patch = nn.Conv2d(3, DIM, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, DIM) * 0.5)
        self.pos = nn.Parameter(torch.randn(1, (IMAGE // patch) ** 2 + 1, DIM) * 0.5)
        self.pre = nn.ModuleList(nn.LayerNorm(DIM) for _ in range(2 * VIT_LAYERS))
        self.qkv = nn.ModuleList(nn.Linear(DIM, 3 * DIM) for _ in range(VIT_LAYERS))
        self.proj = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(VIT_LAYERS))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
                                 for _ in range(VIT_LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, classes)

    def attention(self, x: torch.Tensor, i: int, prev: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        b, n, c = x.shape
        q, k, v = (t.reshape(b, n, HEADS, self.head_dim).transpose(1, 2).reshape(b * HEADS, n, self.head_dim)
                   for t in self.qkv[i](x).chunk(3, dim=-1))
        scores = torch.bmm(q, k.transpose(1, 2)) * self.head_dim**-0.5
        if prev is not None:
            scores = scores + prev
        out = torch.bmm(scores.softmax(-1), v).reshape(b, HEADS, n, self.head_dim).transpose(1, 2).reshape(b, n, c)
        return self.proj[i](out), scores

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch(pixels).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        prev = None
        for i in range(VIT_LAYERS):
            out, prev = self.attention(self.pre[2 * i](x), i, prev)
            x = x + out
            x = x + self.mlp[i](self.pre[2 * i + 1](x))
        return self.head(self.norm(x)[:, 0])


class TokenMajorScoresViT(BmmRealFormerViT):
    """(e) The vision transformer of (d) with ``q, k, v`` as ``[B, N, H, d]`` (``qkv.reshape(b, n, 3, H, d)``) and the
    scores laid out ``[B, N, N, H]`` by ``einsum("bqhd,bkhd->bqkh")``, the softmax over dim 2, and
    ``einsum("bqkh,bkhd->bqhd")``."""

    def attention(self, x: torch.Tensor, i: int, prev: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        b, n, c = x.shape
        q, k, v = self.qkv[i](x).reshape(b, n, 3, HEADS, self.head_dim).unbind(2)
        scores = torch.einsum("bqhd,bkhd->bqkh", q, k) * self.head_dim**-0.5
        if prev is not None:
            scores = scores + prev
        out = torch.einsum("bqkh,bkhd->bqhd", scores.softmax(dim=2), v).reshape(b, n, c)
        return self.proj[i](out), scores


class TokenMajorScoresRealFormer(PaddingMask, Encoder):
    """(f) Scores ``[B, T, T, H]`` as in (e), in a masked encoder: the padding bias laid out ``[B, 1, T, 1]``."""

    def attend(self, q, k, v, prev, mask, layer):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = torch.einsum("bqhd,bkhd->bqkh", q, k) / math.sqrt(self.head_dim)
        if prev is not None:
            scores = scores + prev
        probs = (scores + mask.permute(0, 1, 3, 2)).softmax(dim=2)
        return torch.einsum("bqkh,bkhd->bqhd", probs, v).transpose(1, 2), scores


RESIDUAL_STYLES = {"bert-style": BertStyleRealFormer, "running-mean": RunningMeanRealFormer,
                   "einsum": EinsumRealFormer}
NEAR_MISS = {"scores-after-softmax": ScoresAfterSoftmax, "multiplied-scores": MultipliedScores,
             "carried-mask": CarriedMask}
