"""Depth aggregations (AttnRes): every softmax left by the patterns before is a candidate, fused into one
AttnResAggregate node when its structure matches (match.py), its subgraph depends on nothing but its sources and
constants (region.py), a score weight and eps can be read off it (probe.py) and the fused node agrees with the
original subgraph (verify.py); docs/fusion.md#how-a-site-is-found-read-and-verified."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx

from attnres_export.graphs.fusion.classify import ATTENTION, OTHER, is_attention
from attnres_export.graphs.fusion.context import FusionContext
from attnres_export.graphs.fusion.depth.match import logits_from_a_stack, match_site
from attnres_export.graphs.fusion.depth.merge import merged_site
from attnres_export.graphs.fusion.depth.rewrite import AggregateReplacement, apply_replacements
from attnres_export.graphs.fusion.depth.site import fuse_merged_or_plain
from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.result import Replacement
from attnres_export.ops.opset import AGGREGATE

DEPTH = "depth aggregation"
ATTENTION_REASON = "attention over tokens (scores from two activations), not a depth aggregation: left alone"


@dataclass
class SoftmaxSite:
    anchor: onnx.NodeProto
    name: str
    """The fused node's name (numbered by the softmax's place among all softmaxes)."""


class DepthAggregationPattern:
    op_type = AGGREGATE
    kind = DEPTH

    def sites(self, context: FusionContext, softmaxes: Sequence[onnx.NodeProto]) -> list[SoftmaxSite]:
        """Every softmax: the ones that are no depth aggregation are rejected as attention or other softmaxes."""
        return [SoftmaxSite(n, f"attnres_fusion/aggregate_{context.position[id(n)]}") for n in softmaxes]

    def replace(self, context: FusionContext, site: SoftmaxSite) -> Replacement | Rejected:
        index, node = context.index, site.anchor
        try:
            match = match_site(index, node, context.values)
        except Rejected as exc:
            if is_attention(index, node, context.depends_on_input):
                return Rejected(ATTENTION_REASON, kind=ATTENTION)
            return Rejected(exc.reason, kind=None if logits_from_a_stack(index, node) else OTHER)
        try:
            return fuse_merged_or_plain(context, match, merged_site(index, match, context.values), site.name)
        except Rejected as exc:
            if len(match.sources) == 1 and is_attention(index, node, context.depends_on_input):
                return Rejected(ATTENTION_REASON, kind=ATTENTION)
            return Rejected(exc.reason, sources=len(match.sources))

    def rewrite(self, model: onnx.ModelProto, plans: list[AggregateReplacement]) -> onnx.ModelProto:
        return apply_replacements(model, plans)
