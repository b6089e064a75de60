"""Residual-score attention (RealFormer): attention layers that add the previous layer's raw scores to their own,
each fused into one ResidualScoreAttention node chained through its ``scores`` output
(docs/fusion.md#residual-attention-scores-realformer)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from attnres_export.graphs.fusion.context import FusionContext
from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.residual.rewrite import ResidualReplacement, apply_residual_replacements
from attnres_export.graphs.fusion.residual.scores import ResidualSite, fuse_residual_site, residual_sites
from attnres_export.graphs.fusion.result import Replacement
from attnres_export.ops.opset import RESIDUAL_ATTENTION

RESIDUAL = "residual-score attention"


class ResidualScorePattern:
    op_type = RESIDUAL_ATTENTION
    kind = RESIDUAL

    def sites(self, context: FusionContext, softmaxes: Sequence[onnx.NodeProto]) -> list[ResidualSite]:
        """Attention softmaxes that carry scores between layers; plain attention is left to later patterns."""
        return residual_sites(context, softmaxes)

    def replace(self, context: FusionContext, site: ResidualSite) -> Replacement | Rejected:
        return fuse_residual_site(context, site)

    def rewrite(self, model: onnx.ModelProto, plans: list[ResidualReplacement]) -> onnx.ModelProto:
        return apply_residual_replacements(model, plans)
