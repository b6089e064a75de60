"""``CausalLM``: what every decoder-shaped causal LM shares (``DecoderLM``, ``KimiLinearLM``): the module layout
(``model.embed_tokens``, ``model.layers.{i}``, ``model.norm``, ``lm_head``, and with Attention Residuals K3's sites
``<site>_res_norm`` / ``<site>_res_proj`` on every layer and ``model.output_attn_res_*``), the two residual streams
(standard, or K3's Attention Residuals, docs/models.md#k3-attention-residuals), ``init_example`` and the contract
methods that read only that layout (models/base.py).

A family subclasses it with its body (an ``nn.Module`` with ``embed_tokens``, ``layers``, ``norm`` and, when the config
has ``attn_res``, the output site), its ``forward`` / ``forward_with_past`` (they run its attention through
``_standard`` or ``_attn_res``), its ``with_past()`` and its ``export_plan``. The config needs ``hidden_size``,
``vocab_size``, ``attn_res`` and ``attn_res_block_size``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from attnres_export.models.layers.residual import ResidualNorm, ResidualProjection, aggregate


class CausalLM(nn.Module):
    """A causal LM over ``body`` (registered as ``model``) with an untied ``lm_head``; ``forward(input_ids [B, T])
    -> logits [B, T, V]`` float32 in the subclass."""

    input_axes: ClassVar[dict[str, dict[int, str]]] = {"input_ids": {0: "batch", 1: "seq"}}
    output_names = ("logits",)

    def __init__(self, cfg: Any, body: nn.Module) -> None:
        super().__init__()
        self.config = cfg
        self.model = body
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
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
