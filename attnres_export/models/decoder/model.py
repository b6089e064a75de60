"""``DecoderLM`` (docs/models.md#decoderlm): Llama, Qwen2, Qwen3, Qwen3-MoE and DeepSeek-V3 bodies with
transformers' semantics and module names, with standard residuals or Kimi K3's Attention Residuals.

The module tree is named as transformers names the weights (``model.embed_tokens``,
``model.layers.{i}.self_attn.q_proj``, ..., ``model.norm``, ``lm_head``), so a folder's safetensors load
without renaming. ``forward(input_ids [B, T]) -> logits [B, T, V]`` float32; ``with_past()`` gives the
KV-cache step (``decoder/with_past.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from attnres_export.models.attnres_lm import RMSNorm
from attnres_export.models.base import ExportPlan
from attnres_export.models.decoder.attention import GroupedQueryAttention, LatentAttention
from attnres_export.models.decoder.config import DecoderConfig
from attnres_export.models.decoder.mlp import feed_forward
from attnres_export.models.decoder.residual import ResidualNorm, ResidualProjection, aggregate
from attnres_export.models.decoder.rope import RotaryEmbedding
from attnres_export.models.decoder.with_past import DecoderLMWithPast
from attnres_export.ops.precision import at_least_float32


class DecoderLayer(nn.Module):
    """One decoder layer: attention and feed-forward sublayers, each behind its PreNorm; with AttnRes also the
    two K3 aggregation sites (``self_attention_res_*`` before attention, ``mlp_res_*`` before the MLP)."""

    def __init__(self, cfg: DecoderConfig, index: int) -> None:
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = LatentAttention(cfg) if cfg.mla is not None else GroupedQueryAttention(cfg)
        self.mlp = feed_forward(cfg, index)
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        if cfg.attn_res:
            self.self_attention_res_norm = ResidualNorm(d, eps)
            self.self_attention_res_proj = ResidualProjection(d)
            self.mlp_res_norm = ResidualNorm(d, eps)
            self.mlp_res_proj = ResidualProjection(d)


class DecoderBody(nn.Module):
    """``model.``: embeddings, layers, the final norm (and with AttnRes the output aggregation site)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, d)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        if cfg.attn_res:
            self.output_attn_res_norm = ResidualNorm(d, cfg.rms_norm_eps)
            self.output_attn_res_proj = ResidualProjection(d)
        rotary_dim = cfg.mla.qk_rope_head_dim if cfg.mla is not None else cfg.head_dim
        self.rotary_emb = RotaryEmbedding(cfg.rope, rotary_dim)


class CacheStep:
    """The cached state of one forward step: the pasts handed in (two tensors per layer), the presents made."""

    def __init__(self, past: list[torch.Tensor]) -> None:
        self.past, self.presents = past, []

    def layer_past(self) -> tuple[torch.Tensor, torch.Tensor]:
        i = len(self.presents)
        return self.past[i], self.past[i + 1]


class DecoderLM(nn.Module):
    """A decoder LM of docs/models.md#decoderlm; ``forward(input_ids [B, T]) -> logits [B, T, V]`` float32."""

    input_axes: ClassVar[dict[str, dict[int, str]]] = {"input_ids": {0: "batch", 1: "seq"}}
    output_names = ("logits",)

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
            self.register_load_state_dict_post_hook(_tie_again)
        self.fuse_norms = False
        """Compute each aggregation and the RMSNorm that reads it as one ``attnres::aggregate_norm`` op."""

    STATE_SIZE_KEYS: ClassVar[dict[str, tuple[str, ...]]] = {
        "model.embed_tokens.weight": ("vocab_size", "hidden_size")}
    """State_dict entries whose shapes pin the config's sizes, checked before a model is built."""
    LAYER_PREFIX: ClassVar[str] = "model.layers."

    def init_example(self) -> None:
        """Random weights no check degenerates on: pseudo-queries of std ``2/sqrt(D)`` (zero ones make every
        aggregation a plain mean), norm gains near 1, biases near 0, expert score-correction biases random."""
        with torch.no_grad():
            for name, param in [*self.named_parameters(), *self.named_buffers()]:
                if name.endswith("_res_proj.weight"):
                    param.normal_(0.0, 2.0 / math.sqrt(self.config.hidden_size))
                elif name.endswith(("norm.weight", "layernorm.weight")):
                    param.copy_(1.0 + 0.1 * torch.randn_like(param))
                elif name.endswith((".bias", "e_score_correction_bias")):
                    param.normal_(0.0, 0.02)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        positions = torch.arange(t, device=input_ids.device)[None]
        causal = positions[0][None, :] <= positions[0][:, None]
        return self._logits(input_ids, positions, causal[None, None], None)

    def forward_with_past(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                          past: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One prefill or decode step (docs/decode.md#decoderlm-with-past): ``input_ids``/``position_ids``
        ``[B, T]``, ``attention_mask [B, P+T]`` (1 = token, 0 = padding) over past and new tokens, ``past`` two
        tensors per layer in ``cache_inputs()`` order (``P`` may be 0). A new token at index ``t`` attends cache
        position ``j`` when ``j <= P + t`` and ``attention_mask[j] = 1``; rotary angles follow ``position_ids``.
        Returns ``logits [B, T, V]`` float32 and the presents (the pasts grown by ``T``)."""
        t, total = input_ids.shape[1], attention_mask.shape[1]
        past_len = past[0].shape[2] if self.config.mla is None else past[0].shape[1]
        key_pos = torch.arange(total, device=input_ids.device)
        query_pos = torch.arange(t, device=input_ids.device) + past_len
        allowed = (key_pos[None, :] <= query_pos[:, None])[None, None] & attention_mask[:, None, None, :].bool()
        cache = CacheStep(past)
        return self._logits(input_ids, position_ids, allowed, cache), cache.presents

    def with_past(self) -> DecoderLMWithPast:
        """The KV-cache form (shares these weights): ``decoder/with_past.py``."""
        return DecoderLMWithPast(self)

    def _logits(self, input_ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor,
                cache: CacheStep | None) -> torch.Tensor:
        body = self.model
        cos, sin = (c.unsqueeze(1) for c in body.rotary_emb(positions))

        def attention(layer: DecoderLayer, x: torch.Tensor) -> torch.Tensor:
            out, present = layer.self_attn(x, cos, sin, allowed, None if cache is None else cache.layer_past())
            if cache is not None:
                cache.presents += present
            return out

        h = body.embed_tokens(input_ids)
        x = self._attn_res(h, attention) if self.config.attn_res else self._standard(h, attention)
        return at_least_float32(self.lm_head(x))

    def _standard(self, h: torch.Tensor, attention) -> torch.Tensor:
        for layer in self.model.layers:
            h = h + attention(layer, layer.input_layernorm(h))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.norm(h)

    def _attn_res(self, embedding: torch.Tensor, attention) -> torch.Tensor:
        """K3's Attention Residuals (docs/models.md#k3-attention-residuals). ``bank`` holds the block snapshots,
        ``partial`` the running sum of the current block. At the start of every layer whose index is a multiple
        of ``attn_res_block_size`` the running sum is snapshotted (the embedding at layer 0) and restarted, after
        the attention input has been aggregated; layer 0's attention reads the embedding directly (there is
        nothing to aggregate). Returns the final normalized representation."""
        block, fused = self.config.attn_res_block_size, self.fuse_norms
        bank: list[torch.Tensor] = []
        partial: torch.Tensor | None = embedding
        for i, layer in enumerate(self.model.layers):
            if bank:
                x = aggregate(layer.self_attention_res_norm, layer.self_attention_res_proj, [*bank, partial],
                              layer.input_layernorm, fused)
            else:
                x = layer.input_layernorm(partial)
            if i % block == 0:
                bank.append(partial)
                partial = None
            out = attention(layer, x)
            partial = out if partial is None else partial + out
            x = aggregate(layer.mlp_res_norm, layer.mlp_res_proj, [*bank, partial], layer.post_attention_layernorm,
                          fused)
            partial = partial + layer.mlp(x)
        body = self.model
        return aggregate(body.output_attn_res_norm, body.output_attn_res_proj, [*bank, partial], body.norm, fused)

    def _sites(self) -> list[tuple[ResidualNorm, ResidualProjection]]:
        """The (norm, proj) pair of every aggregation the forward pass runs (not layer 0's attention site)."""
        if not self.config.attn_res:
            return []
        layers = list(self.model.layers)
        sites = [(layer.self_attention_res_norm, layer.self_attention_res_proj) for layer in layers[1:]]
        sites += [(layer.mlp_res_norm, layer.mlp_res_proj) for layer in layers]
        return [*sites, (self.model.output_attn_res_norm, self.model.output_attn_res_proj)]

    @contextmanager
    def norms_fused(self) -> Iterator[None]:
        """Inside, every aggregation and the RMSNorm after it run as one ``attnres::aggregate_norm`` op."""
        self.fuse_norms = True
        try:
            yield
        finally:
            self.fuse_norms = False

    @contextmanager
    def score_weights_folded(self) -> Iterator[None]:
        """Inside, every site's ``g * w`` is one frozen float32 tensor (one initializer per aggregation at export);
        afterwards it is computed again from the weights."""
        sites = self._sites()
        for norm, proj in sites:
            proj.fold(norm)
        try:
            yield
        finally:
            for _, proj in sites:
                proj.score_weight = None

    def random_inputs(self, batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Token ids ``[batch, seq]`` drawn uniformly from the vocabulary."""
        return {"input_ids": rng.integers(0, self.config.vocab_size, size=(batch, seq), dtype=np.int64)}

    def aggregation_count(self) -> int:
        """Depth aggregations in one forward pass: with AttnRes every layer's MLP site, every attention site but
        layer 0's (it has no snapshot to mix) and the output site, ``2 * num_hidden_layers``; else 0."""
        return len(self._sites())

    def fused_node_count(self) -> int:
        """attnres nodes an export holds: one AttnResAggregate (or AttnResAggregateNorm) per aggregation."""
        return self.aggregation_count()

    def export_plan(self, with_past: bool = False, fuse_norm: bool = False) -> ExportPlan:
        """The model as the exporter assembles it: ``decoder/plan.py``."""
        from attnres_export.models.decoder.plan import decoder_plan

        return decoder_plan(self, with_past, fuse_norm)


def _tie_again(model: DecoderLM, _incompatible) -> None:
    """``load_state_dict(assign=True)`` replaces both tensors of a tied pair; the head reads the embedding again."""
    model.lm_head.weight = model.model.embed_tokens.weight
