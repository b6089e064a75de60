"""Export plans of the decoder bodies (``DecoderLM``; ``KimiLinearLM`` reuses the residual stream): the model as
the exporter assembles it (models/base.py:ExportPlan, docs/exporter-notes.md#assembled-export).

A piece is one sublayer with its PreNorm (unless an ``AttnResAggregateNorm`` step applies it): the attention of a
layer, its dense or MoE feed-forward, plus the embedding (with the rotary tables and the mask every layer reads)
and the head. Pieces of one kind compute the same function: every attention layer of a body is one kind
(grouped-query or latent), dense and MoE feed-forwards are two. Between the pieces the plan lists what
``DecoderLM._standard`` / ``_attn_res`` compute there, in the same order: the residual adds, or K3's aggregations
and partial sums.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnres_export.models.attnres_lm import RMSNorm
from attnres_export.models.base import CacheInput, ExportPlan, PlanAdd, PlanAggregate, PlanPiece, PlanStep, PlanValue
from attnres_export.models.decoder.mlp import GatedMLP
from attnres_export.models.decoder.moe import MoEFeedForward
from attnres_export.models.decoder.residual import ResidualNorm, ResidualProjection
from attnres_export.ops.precision import at_least_float32

STEP_INPUTS = ("input_ids", "attention_mask", "position_ids")


@dataclass
class PlanSteps:
    """The steps of a plan being written, the model's config, and whether AttnResAggregateNorm steps apply the
    PreNorms."""

    config: Any
    fuse_norm: bool
    steps: list[PlanStep] = field(default_factory=list)

    def piece(self, kind: str, name: str, module: nn.Module, inputs: tuple[str, ...], outputs: tuple[str, ...],
              signature: tuple[PlanValue, ...]) -> str:
        """Add a piece; returns its first output."""
        self.steps.append(PlanPiece(kind, name, module, inputs, outputs, signature))
        return outputs[0]

    def aggregate(self, name: str, norm: ResidualNorm, proj: ResidualProjection, sources: list[str],
                  prenorm: RMSNorm) -> str:
        """One K3 site: ``attnres::aggregate`` of ``sources`` (``attnres::aggregate_norm`` with the PreNorm when
        fusing), as ``decoder/residual.py:aggregate`` computes it."""
        fused = self.fuse_norm
        self.steps.append(PlanAggregate(
            name, tuple(sources), f"{name}.out", proj.compute_score_weight(norm).detach(), norm.eps,
            at_least_float32(prenorm.weight).detach() if fused else None, prenorm.eps if fused else 0.0))
        return f"{name}.out"

    def add(self, a: str, b: str, output: str) -> str:
        self.steps.append(PlanAdd(a, b, output))
        return output


Sublayer = Callable[[int, nn.Module, str, RMSNorm | None], str]
"""``(layer index, layer, input value, PreNorm or None) -> output value``: adds one attention piece."""


def hidden(cfg) -> PlanValue:
    return PlanValue("x", ("batch", "seq", cfg.hidden_size))


def graph_inputs(cache: list[CacheInput]) -> tuple[PlanValue, ...]:
    """The plain graph's token ids, or the with-past graph's step inputs and cache."""
    ids = PlanValue("input_ids", ("batch", "seq"), "int64")
    if not cache:
        return (ids,)
    return (ids, PlanValue("attention_mask", ("batch", "total"), "int64"),
            PlanValue("position_ids", ("batch", "seq"), "int64"), *(PlanValue(c.name, c.axes, c.dtype) for c in cache))


def state_signature(states: list[CacheInput]) -> tuple[PlanValue, ...]:
    return tuple(PlanValue(f"past_{i}", c.axes, c.dtype) for i, c in enumerate(states))


def residual_steps(lm: nn.Module, plan: PlanSteps, attention: Sublayer) -> str:
    """The layers of ``lm`` (a ``DecoderLM`` or a body laid out as one) and the final site, after the
    ``embedding`` value: ``_standard`` or ``_attn_res``, step by step. Returns the value the head reads."""
    body, cfg = lm.model, lm.config
    if not cfg.attn_res:
        h = "embedding"
        for i, layer in enumerate(body.layers):
            h = plan.add(h, attention(i, layer, h, layer.input_layernorm), f"model.layers.{i}.attn_residual")
            h = plan.add(h, feed_forward(plan, i, layer, h, layer.post_attention_layernorm),
                         f"model.layers.{i}.mlp_residual")
        return h
    block, fused = cfg.attn_res_block_size, plan.fuse_norm
    bank: list[str] = []
    partial: str | None = "embedding"
    for i, layer in enumerate(body.layers):
        prefix = f"model.layers.{i}"
        if bank:
            x = plan.aggregate(f"{prefix}.self_attention_res", layer.self_attention_res_norm,
                               layer.self_attention_res_proj, [*bank, partial], layer.input_layernorm)
            prenorm = None if fused else layer.input_layernorm
        else:
            x, prenorm = partial, layer.input_layernorm
        if i % block == 0:
            bank.append(partial)
            partial = None
        out = attention(i, layer, x, prenorm)
        partial = out if partial is None else plan.add(partial, out, f"{prefix}.attn_partial")
        x = plan.aggregate(f"{prefix}.mlp_res", layer.mlp_res_norm, layer.mlp_res_proj, [*bank, partial],
                           layer.post_attention_layernorm)
        partial = plan.add(partial, feed_forward(plan, i, layer, x, None if fused else layer.post_attention_layernorm),
                           f"{prefix}.mlp_partial")
    return plan.aggregate("model.output_attn_res", body.output_attn_res_norm, body.output_attn_res_proj,
                          [*bank, partial], body.norm)


FEED_FORWARD_KINDS: dict[type, str] = {GatedMLP: "mlp", MoEFeedForward: "moe"}
"""The kind names of the decoder family's own feed-forwards; any other class is its own kind under its name."""


def kind(base: str, prenorm: RMSNorm | None) -> str:
    """Pieces with and without their PreNorm are two kinds (layer 0's attention keeps its PreNorm when the other
    layers' are fused into their aggregations)."""
    return base if prenorm is not None else f"{base}-prenormed"


def feed_forward(plan: PlanSteps, i: int, layer: nn.Module, x: str, prenorm: RMSNorm | None) -> str:
    """Layer ``i``'s feed-forward piece, one kind per module class (a body may mix dense and expert layers, and
    Kimi K3's SiTU and latent-MoE modules are classes of their own)."""
    base = FEED_FORWARD_KINDS.get(type(layer.mlp), type(layer.mlp).__name__)
    name = f"model.layers.{i}.mlp"
    return plan.piece(kind(base, prenorm), name, PrenormedPiece(prenorm, layer.mlp), (x,), (f"{name}.out",),
                      (hidden(plan.config),))


def head_piece(lm: nn.Module, plan: PlanSteps, x: str) -> None:
    norm = None if lm.config.attn_res and plan.fuse_norm else lm.model.norm
    plan.piece("head", "lm_head", HeadPiece(norm, lm.lm_head), (x,), ("logits",), (hidden(lm.config),))


class PrenormedPiece(nn.Module):
    """A feed-forward on its input, after its PreNorm unless an AttnResAggregateNorm applied it."""

    def __init__(self, prenorm: RMSNorm | None, fn: nn.Module) -> None:
        super().__init__()
        self.prenorm, self.fn = prenorm, fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x if self.prenorm is None else self.prenorm(x))


class HeadPiece(nn.Module):
    """The final norm (unless an AttnResAggregateNorm applied it) and the LM head, float32 logits."""

    def __init__(self, norm: RMSNorm | None, lm_head: nn.Linear) -> None:
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return at_least_float32(self.lm_head(x if self.norm is None else self.norm(x)))


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
