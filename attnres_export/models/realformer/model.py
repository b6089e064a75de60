"""``RealFormer``: the reference BERT-style Post-LN encoder with residual attention scores (docs/models.md#realformer).

One readable file: the math is visible. Every attention goes through ``attnres::residual_score_attention``
so the exporter sees exactly one op per layer; the op returns the running score sum that the next layer
takes (pre-mask, pre-softmax), while the padding bias is added afresh in every layer and never carried.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnres_export.models.config import FamilyConfig
from attnres_export.models.limits import EPS, HEADS, LAYERS, WIDTH, Range
from attnres_export.ops.precision import at_least_float32
from attnres_export.ops.residual_attention import residual_score_attention

MASK_BIAS = -10000.0
"""Additive logit bias of a padding key (BERT's convention, docs/models.md#realformer)."""


@dataclass(frozen=True)
class RealFormerConfig(FamilyConfig):
    """Hyper-parameters of ``RealFormer`` (docs/models.md#realformer)."""

    arch: str = "realformer"
    vocab_size: int = 256
    max_seq_len: int = 512
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 128
    eps: float = 1e-12
    running_mean: bool = False
    """Divide layer l's summed scores by l + 1 (RealFormer's running-mean variant)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"running_mean"})
    LEGACY: ClassVar[dict] = {"residual": "standard", "block_size": 0}
    RANGES: ClassVar[dict[str, Range]] = {
        **FamilyConfig.RANGES, "d_model": WIDTH, "n_layers": LAYERS, "n_heads": HEADS, "d_ff": WIDTH, "eps": EPS}

    def problems(self) -> Iterator[str]:
        yield from super().problems()
        if self.arch != "realformer":
            yield f"arch must be realformer, got {self.arch!r}"
        if self.n_heads >= 1 and self.d_model % self.n_heads:
            yield f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def describe(self) -> str:
        return f"running mean {'on' if self.running_mean else 'off'}"


class LayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32 and returned in the input dtype.

    BERT's eps of 1e-12 vanishes in float16 and the variance can overflow there, so a float16 or
    bfloat16 export normalises in float32 like the project's RMSNorm.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.layer_norm(at_least_float32(x), self.normalized_shape, at_least_float32(self.weight),
                              at_least_float32(self.bias), self.eps)
        return normed.to(x.dtype)


class Embeddings(nn.Module):
    """Token + learned position embeddings, then LayerNorm."""

    def __init__(self, cfg: RealFormerConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.norm = LayerNorm(cfg.d_model, eps=cfg.eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok(input_ids) + self.pos.weight[: input_ids.shape[1]])


class ResidualScoreAttention(nn.Module):
    """Multi-head attention whose raw scores add the previous layer's running sum (docs/models.md#realformer)."""

    def __init__(self, cfg: RealFormerConfig, layer_index: int) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.logit_divisor = float(layer_index + 1) if cfg.running_mean else 1.0
        self.wq = nn.Linear(d, d)
        self.wk = nn.Linear(d, d)
        self.wv = nn.Linear(d, d)
        self.wo = nn.Linear(d, d)

    def forward(
        self, x: torch.Tensor, prev_scores: torch.Tensor | None, mask_bias: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, d = x.shape

        def heads(proj: nn.Linear) -> torch.Tensor:
            return proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

        out, scores = residual_score_attention(
            heads(self.wq), heads(self.wk), heads(self.wv), prev_scores, mask_bias,
            self.head_dim**-0.5, self.logit_divisor,
        )
        return self.wo(out.transpose(1, 2).reshape(b, t, d)), scores


class FeedForward(nn.Module):
    """``W2 gelu(W1 x)`` with the exact (erf) GELU."""

    def __init__(self, cfg: RealFormerConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Layer(nn.Module):
    """Post-LN layer: ``x = LN(x + attn(x))``, ``x = LN(x + ffn(x))``."""

    def __init__(self, cfg: RealFormerConfig, index: int) -> None:
        super().__init__()
        self.attn = ResidualScoreAttention(cfg, index)
        self.attn_norm = LayerNorm(cfg.d_model, eps=cfg.eps)
        self.ffn = FeedForward(cfg)
        self.ffn_norm = LayerNorm(cfg.d_model, eps=cfg.eps)

    def forward(
        self, x: torch.Tensor, prev_scores: torch.Tensor | None, mask_bias: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        attended, scores = self.attn(x, prev_scores, mask_bias)
        x = self.attn_norm(x + attended)
        return self.ffn_norm(x + self.ffn(x)), scores


def padding_bias(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, 1, 1, T]`` float32: exactly ``MASK_BIAS`` where the key is padding (mask 0), else 0."""
    padding = (attention_mask == 0)[:, None, None, :]
    return torch.where(padding, MASK_BIAS, 0.0).to(torch.float32)


class RealFormer(nn.Module):
    """Encoder of docs/models.md#realformer: ``forward(input_ids, attention_mask [B,T]) -> hidden [B,T,D]`` float32."""

    input_axes: ClassVar[dict[str, dict[int, str]]] = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "seq"},
    }
    output_names = ("hidden",)

    def __init__(self, cfg: RealFormerConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = Embeddings(cfg)
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.n_layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.forward_with_scores(input_ids, attention_mask)[0]

    def forward_with_scores(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``hidden`` and every layer's carried running score sum ``R_l`` (for tests and inspection)."""
        mask_bias = padding_bias(attention_mask)
        x = self.embed(input_ids)
        carried: list[torch.Tensor] = []
        for layer in self.layers:
            x, scores = layer(x, carried[-1] if carried else None, mask_bias)
            carried.append(scores)
        return at_least_float32(x), carried

    def score_weights_folded(self) -> AbstractContextManager[None]:
        """Nothing to fold: RealFormer has no AttnRes aggregation weights (models/base.py)."""
        return nullcontext()

    def norms_fused(self) -> AbstractContextManager[None]:
        """Nothing to fuse: Post-LN LayerNorms follow residual adds, not aggregations."""
        return nullcontext()

    def aggregation_count(self) -> int:
        return 0

    def with_past(self) -> None:
        """An encoder: no KV cache."""
        return None

    STATE_SIZE_KEYS: ClassVar[dict[str, tuple[str, ...]]] = {
        "embed.tok.weight": ("vocab_size", "d_model"), "embed.pos.weight": ("max_seq_len", "d_model"),
        "layers.0.ffn.w1.weight": ("d_ff", "d_model")}
    LAYER_PREFIX: ClassVar[str] = "layers."

    def init_example(self) -> None:
        """Query and key projections of std ``1.5/sqrt(D)``: attention scores of std about 2, neither uniform nor
        one-hot; LayerNorm gains near 1 and biases near 0."""
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.endswith("norm.weight"):
                    param.copy_(1.0 + 0.1 * torch.randn_like(param))
                elif name.endswith("norm.bias"):
                    param.normal_(0.0, 0.02)
                elif name.endswith(("attn.wq.weight", "attn.wk.weight")):
                    param.normal_(0.0, 1.5 / math.sqrt(self.config.d_model))

    def fused_node_count(self) -> int:
        """ResidualScoreAttention nodes an export holds: one per layer."""
        return self.config.n_layers

    def export_plan(self, with_past: bool = False, fuse_norm: bool = False):
        """The model as the exporter assembles it (``models/realformer/plan.py``); None with ``running_mean``."""
        from attnres_export.models.realformer.plan import realformer_plan

        return realformer_plan(self)

    def random_inputs(self, batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Token ids and an int64 mask; every other row, counted from the last, ends in padding.

        So a batch of one is padded too; every row keeps at least one real token (a single-token row none).
        """
        ids = rng.integers(0, self.config.vocab_size, size=(batch, seq), dtype=np.int64)
        mask = np.ones((batch, seq), dtype=np.int64)
        if seq > 1:
            for row in range(batch - 1, -1, -2):
                mask[row, rng.integers(1, seq):] = 0
        return {"input_ids": ids, "attention_mask": mask}
