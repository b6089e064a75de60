"""Export-plan pieces shared by the decoder-shaped bodies (``DecoderLM``, ``KimiLinearLM``): the plan being written,
the graph inputs, the residual stream between the pieces (``CausalLM._standard`` / ``_attn_res`` step by step), the
feed-forward and head pieces (models/base.py:ExportPlan, docs/exporter-notes.md#assembled-export)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnres_export.models.base import CacheInput, PlanAdd, PlanAggregate, PlanPiece, PlanStep, PlanValue
from attnres_export.models.layers.mlp import GatedMLP
from attnres_export.models.layers.moe import MoEFeedForward
from attnres_export.models.layers.norm import RMSNorm
from attnres_export.models.layers.residual import ResidualNorm, ResidualProjection
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
        fusing), as ``layers/residual.py:aggregate`` computes it."""
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
