"""The export plan of a ``RealFormer`` (models/base.py:ExportPlan, docs/exporter-notes.md#assembled-export).

A piece is one Post-LN layer, ``(x, carried scores, padding bias) -> (x, scores)``: the running score sum flows
from piece to piece as a plain value of the plan, so no attnres node sits between pieces (each layer's
``ResidualScoreAttention`` is inside its piece). Layer 0 reads no carried scores and is a kind of its own; the
other layers are one kind. With ``running_mean`` every layer divides its scores by its own ``l + 1``, a constant
of the traced op, so no two layers compute the same function: such a model has no plan and is traced whole.
"""

from __future__ import annotations

import torch
from torch import nn

from attnres_export.models.base import ExportPlan, PlanPiece, PlanValue
from attnres_export.models.realformer.model import RealFormer, padding_bias
from attnres_export.ops.precision import at_least_float32


class _Embedding(nn.Module):
    """The embeddings and the padding bias every layer adds."""

    def __init__(self, model: RealFormer) -> None:
        super().__init__()
        self.embed = model.embed

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.embed(input_ids), padding_bias(attention_mask)


class _Layer(nn.Module):
    """One layer; the last one also widens its output to float32 (the graph's ``hidden``)."""

    def __init__(self, layer: nn.Module, last: bool) -> None:
        super().__init__()
        self.layer, self.last = layer, last

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor, *carried: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        x, scores = self.layer(x, carried[0] if carried else None, mask_bias)
        return at_least_float32(x) if self.last else (x, scores)


def realformer_plan(model: RealFormer) -> ExportPlan | None:
    """Embedding, first layer, the other layers, and the last layer (whose output is the graph's): four kinds at
    most; None with ``running_mean``."""
    cfg = model.config
    if cfg.running_mean and cfg.n_layers > 1:
        return None
    ids = PlanValue("input_ids", ("batch", "seq"), "int64")
    mask = PlanValue("attention_mask", ("batch", "seq"), "int64")
    hidden = PlanValue("x", ("batch", "seq", cfg.d_model))
    bias = PlanValue("mask_bias", ("batch", 1, 1, "seq"), "float32")
    scores = PlanValue("scores", ("batch", cfg.n_heads, "seq", "seq"), "float32")
    steps = [PlanPiece("embedding", "embed", _Embedding(model), ("input_ids", "attention_mask"),
                       ("embedding", "mask_bias"), (ids, mask))]
    x, carried, last = "embedding", (), cfg.n_layers - 1
    for i, layer in enumerate(model.layers):
        kind = ("first-layer" if i == 0 else "layer") + ("-last" if i == last else "")
        outputs = ("hidden",) if i == last else (f"layers.{i}.out", f"layers.{i}.scores")
        steps.append(PlanPiece(kind, f"layers.{i}", _Layer(layer, i == last), (x, "mask_bias", *carried), outputs,
                               (hidden, bias, *((scores,) if carried else ()))))
        x, carried = outputs[0], outputs[1:]
    return ExportPlan((ids, mask), tuple(steps), ("hidden",))
