"""The export plan of a ``KimiLinearLM`` (models/base.py:ExportPlan, docs/exporter-notes.md#assembled-export).

The residual stream, the K3 sites, the feed-forward and head pieces are the shared ones (``layers/plan.py``); what
differs is the embedding (no rotary table: it makes the causal mask the latent-attention layers read and, with the
past, the new tokens' padding mask the KDA layers read) and the two attention kinds: a KDA piece (one
``KimiDeltaAttention`` node; with the past it takes and returns the recurrent and the three convolution states) and
a NoPE latent-attention piece (with the past it takes and returns the latent and the shared key part).
"""

from __future__ import annotations

import torch
from torch import nn

from attnres_export.models.base import ExportPlan, PlanValue
from attnres_export.models.kimi.kda import KdaState
from attnres_export.models.kimi.model import KDA_STATE_TENSORS, MLA_STATE_TENSORS
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
    """The token embedding, and what ``KimiLinearLM.forward`` / ``forward_with_past`` derive from the step's
    shapes and mask: ``allowed`` (causal, after the past, padding masked) when the body has latent attention,
    the new tokens' mask ``[B, T, 1]`` when it has KDA layers and a past."""

    def __init__(self, embed_tokens: nn.Embedding, with_past: bool, latent: bool, linear: bool) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.with_past, self.latent, self.linear = with_past, latent, linear

    def forward(self, input_ids: torch.Tensor, *step: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = input_ids.shape[1]
        outputs = [self.embed_tokens(input_ids)]
        if not self.with_past:
            positions = torch.arange(t, device=input_ids.device)
            if self.latent:
                outputs.append((positions[None, :] <= positions[:, None])[None, None])
            return tuple(outputs)
        attention_mask = step[0]
        total = attention_mask.shape[1]
        if self.latent:
            key_pos = torch.arange(total, device=input_ids.device)
            query_pos = torch.arange(t, device=input_ids.device) + (total - t)
            outputs.append((key_pos[None, :] <= query_pos[:, None])[None, None]
                           & attention_mask[:, None, None, :].bool())
        if self.linear:
            outputs.append(attention_mask[:, total - t:, None])
        return tuple(outputs)


class _Kda(nn.Module):
    """One KDA layer on its input (after its PreNorm unless an AttnResAggregateNorm applied it); with the past the
    input is zeroed at padded tokens first and the four states come in and out."""

    def __init__(self, prenorm: RMSNorm | None, kda: nn.Module, cached: bool) -> None:
        super().__init__()
        self.prenorm, self.kda, self.cached = prenorm, kda, cached

    def forward(self, x: torch.Tensor, *step: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        x = x if self.prenorm is None else self.prenorm(x)
        if not self.cached:
            return self.kda(x, None)[0]
        new_tokens_mask, *state = step
        out, present = self.kda(x * new_tokens_mask.to(x.dtype), KdaState(*state))
        return (out, *present)


class _Latent(nn.Module):
    """One NoPE latent-attention layer on its input; with the past the latent and shared key come in and out."""

    def __init__(self, prenorm: RMSNorm | None, attention: nn.Module, cached: bool) -> None:
        super().__init__()
        self.prenorm, self.attention, self.cached = prenorm, attention, cached

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, *past: torch.Tensor
                ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        x = x if self.prenorm is None else self.prenorm(x)
        out, present = self.attention(x, allowed, tuple(past) if self.cached else None)
        return (out, *present) if self.cached else out


def kimi_plan(lm: nn.Module, with_past: bool, fuse_norm: bool) -> ExportPlan:
    """The plan of a ``KimiLinearLM``'s plain or with-past graph: embedding, KDA, latent attention, dense and MoE
    feed-forwards, head (and the PreNorm-less kinds ``fuse_norm`` adds)."""
    cfg = lm.config
    if fuse_norm and not cfg.attn_res:
        raise ValueError("fuse_norm needs depth aggregations; this model has standard residuals")
    layers = list(lm.model.layers)
    latent, linear = any(not layer.linear for layer in layers), any(layer.linear for layer in layers)
    cache = lm.with_past().cache_inputs() if with_past else []
    inputs = graph_inputs(cache)
    plan = PlanSteps(cfg, fuse_norm)
    embed_inputs = STEP_INPUTS[:2] if with_past else ("input_ids",)
    outputs = ("embedding", *(["allowed"] if latent else []), *(["new_tokens"] if linear and with_past else []))
    plan.piece("embedding", "model.embed_tokens", _Embedding(lm.model.embed_tokens, with_past, latent, linear),
               embed_inputs, outputs, inputs[:len(embed_inputs)])
    mask = PlanValue("allowed", ("batch", 1, "seq", "total") if with_past else (1, 1, "seq", "seq"), "bool")
    new_tokens = PlanValue("new_tokens", ("batch", "seq", 1), "int64")
    states = iter(cache)

    def attention(i: int, layer: nn.Module, x: str, prenorm: RMSNorm | None) -> str:
        past = [next(states) for _ in range(KDA_STATE_TENSORS if layer.linear else MLA_STATE_TENSORS)] \
            if with_past else []
        name = f"model.layers.{i}.self_attn"
        presents = (f"{name}.out", *(c.present for c in past))
        if layer.linear:
            step = ("new_tokens",) if with_past else ()
            return plan.piece(kind("kda", prenorm), name, _Kda(prenorm, layer.self_attn, with_past),
                              (x, *step, *(c.name for c in past)), presents,
                              (hidden(cfg), *((new_tokens,) if with_past else ()), *state_signature(past)))
        return plan.piece(kind("latent-attention", prenorm), name, _Latent(prenorm, layer.self_attn, with_past),
                          (x, "allowed", *(c.name for c in past)), presents,
                          (hidden(cfg), mask, *state_signature(past)))

    head_piece(lm, plan, residual_steps(lm, plan, attention))
    return ExportPlan(inputs, tuple(plan.steps), ("logits", *(c.present for c in cache)))
