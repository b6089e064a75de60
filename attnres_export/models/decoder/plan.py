"""The export plan of a ``DecoderLM`` (the residual stream, feed-forward and head pieces are ``layers/plan.py``'s): the
model as the exporter assembles it (models/base.py:ExportPlan, docs/exporter-notes.md#assembled-export).

A piece is one sublayer with its PreNorm (unless an ``AttnResAggregateNorm`` step applies it): the attention of a
layer, its dense or MoE feed-forward, plus the embedding (with the rotary tables and the mask every layer reads)
and the head. Pieces of one kind compute the same function: every attention layer of a body is one kind
(grouped-query or latent), dense and MoE feed-forwards are two. Between the pieces the plan lists what
``CausalLM._standard`` / ``_attn_res`` compute there, in the same order: the residual adds, or K3's aggregations
and partial sums.
"""

from __future__ import annotations

import torch
from torch import nn

from attnres_export.models.base import ExportPlan, PlanValue
from attnres_export.models.layers.norm import RMSNorm
from attnres_export.models.layers.plan import (
    STEP_INPUTS,
    PlanSteps,
    graph_inputs,
    head_piece,
    hidden,
    kind,
    residual_steps,
    state_signature,
)


class _Embedding(nn.Module):
    """The first piece of a decoder graph: the token embedding, the rotary cos/sin of the positions and the mask
    ``allowed`` every attention layer reads (plain: positions 0..T-1, causal; with-past: ``position_ids``, causal
    after the past and the padding mask), as ``DecoderLM.forward`` / ``forward_with_past`` make them."""

    def __init__(self, lm: nn.Module, with_past: bool) -> None:
        super().__init__()
        self.embed_tokens, self.rotary_emb = lm.model.embed_tokens, lm.model.rotary_emb
        self.with_past, self.latent = with_past, lm.config.mla is not None

    def forward(self, input_ids: torch.Tensor, *step: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = input_ids.shape[1]
        if not self.with_past:
            positions = torch.arange(t, device=input_ids.device)[None]
            causal = positions[0][None, :] <= positions[0][:, None]
            allowed = causal[None, None]
        else:
            attention_mask, positions, past = step
            total = attention_mask.shape[1]
            past_len = past.shape[1] if self.latent else past.shape[2]
            key_pos = torch.arange(total, device=input_ids.device)
            query_pos = torch.arange(t, device=input_ids.device) + past_len
            allowed = (key_pos[None, :] <= query_pos[:, None])[None, None] & attention_mask[:, None, None, :].bool()
        cos, sin = (c.unsqueeze(1) for c in self.rotary_emb(positions))
        return self.embed_tokens(input_ids), cos, sin, allowed


class _Attention(nn.Module):
    """One layer's attention on its input (after its PreNorm unless an AttnResAggregateNorm applied it); with
    the past it also returns the two tensors to cache."""

    def __init__(self, prenorm: RMSNorm | None, attention: nn.Module, cached: bool) -> None:
        super().__init__()
        self.prenorm, self.attention, self.cached = prenorm, attention, cached

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, allowed: torch.Tensor,
                *past: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        x = x if self.prenorm is None else self.prenorm(x)
        out, present = self.attention(x, cos, sin, allowed, tuple(past) if self.cached else None)
        return (out, *present) if self.cached else out


def decoder_plan(lm: nn.Module, with_past: bool, fuse_norm: bool) -> ExportPlan:
    """The plan of a ``DecoderLM``'s plain or with-past graph: four kinds of piece (embedding, attention, dense
    and/or MoE feed-forward, head), five when ``fuse_norm`` leaves layer 0's attention its own PreNorm."""
    cfg = lm.config
    if fuse_norm and not cfg.attn_res:
        raise ValueError("fuse_norm needs depth aggregations; this model has standard residuals")
    cache = lm.with_past().cache_inputs() if with_past else []
    inputs = graph_inputs(cache)
    plan = PlanSteps(cfg, fuse_norm)
    rotary = cfg.mla.qk_rope_head_dim if cfg.mla is not None else cfg.head_dim
    rows: tuple[str | int, ...] = ("batch", 1, "seq", rotary) if with_past else (1, 1, "seq", rotary)
    mask = PlanValue("allowed", ("batch", 1, "seq", "total") if with_past else (1, 1, "seq", "seq"), "bool")
    tables = (PlanValue("cos", rows, "float32"), PlanValue("sin", rows, "float32"), mask)
    embed_inputs = (*STEP_INPUTS, cache[0].name) if with_past else ("input_ids",)
    plan.piece("embedding", "model.embed_tokens", _Embedding(lm, with_past), embed_inputs,
               ("embedding", "cos", "sin", "allowed"), inputs[:len(embed_inputs)])
    states = iter(cache)
    base = "latent-attention" if cfg.mla is not None else "attention"

    def attention(i: int, layer: nn.Module, x: str, prenorm: RMSNorm | None) -> str:
        past = [next(states), next(states)] if with_past else []
        name = f"model.layers.{i}.self_attn"
        return plan.piece(kind(base, prenorm), name, _Attention(prenorm, layer.self_attn, with_past),
                          (x, "cos", "sin", "allowed", *(c.name for c in past)),
                          (f"{name}.out", *(c.present for c in past)),
                          (hidden(cfg), *tables, *state_signature(past)))

    head_piece(lm, plan, residual_steps(lm, plan, attention))
    return ExportPlan(inputs, tuple(plan.steps), ("logits", *(c.present for c in cache)))
