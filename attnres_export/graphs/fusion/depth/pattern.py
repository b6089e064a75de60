"""Depth aggregations (AttnRes): every softmax left by the patterns before is a candidate, fused into one
AttnResAggregate node when its structure matches (match.py), its subgraph depends on nothing but its sources and
constants (region.py), a score weight and eps can be read off it (probe.py) and the fused node agrees with the
original subgraph (verify.py); docs/fusion.md#how-a-site-is-found-read-and-verified.

A softmax that scores several queries at once (a batched phase 1 of two-phase Block AttnRes) is one site per query.
A one-key softmax that scores the partial inside another site's two-phase merge is fused with that merge, as part
of its node, when the merge fuses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx

from attnres_export.graphs.fusion.classify import ATTENTION, OTHER, is_attention
from attnres_export.graphs.fusion.context import FusionContext
from attnres_export.graphs.fusion.depth.match import SiteMatch, logits_from_a_stack, match_sites
from attnres_export.graphs.fusion.depth.merge import merged_site
from attnres_export.graphs.fusion.depth.rewrite import AggregateReplacement, apply_replacements
from attnres_export.graphs.fusion.depth.site import fuse_merged_or_plain
from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.region import extract_region
from attnres_export.graphs.fusion.result import Replacement, site_label
from attnres_export.ops.opset import AGGREGATE

DEPTH = "depth aggregation"
ATTENTION_REASON = "attention over tokens (scores from two activations), not a depth aggregation: left alone"


@dataclass
class SoftmaxSite:
    anchor: onnx.NodeProto
    name: str
    """The fused node's name (numbered by the softmax's place among all softmaxes, and the query)."""
    label: str
    match: SiteMatch | Rejected
    merged: SiteMatch | None = None
    """The two-phase merge of ``match`` with a partial, when one follows it (merge.py)."""
    within: SoftmaxSite | None = None
    """The site whose merge computes this one's result only to merge it (a one-key softmax over the partial)."""
    merge_fused: bool = False
    """Set once ``merged`` is fused: the sites ``within`` it then have no node of their own."""


class DepthAggregationPattern:
    op_type = AGGREGATE
    kind = DEPTH

    def sites(self, context: FusionContext, softmaxes: Sequence[onnx.NodeProto]) -> list[SoftmaxSite]:
        """Every softmax (one site per query when it scores several): the ones that are no depth aggregation are
        rejected as attention or other softmaxes. The sites inside another's merge come after it."""
        sites = []
        for node in softmaxes:
            name = f"attnres_fusion/aggregate_{context.position[id(node)]}"
            try:
                matches = match_sites(context.index, node, context.values)
            except Rejected as exc:
                sites.append(SoftmaxSite(node, name, site_label(node), exc))
                continue
            for match in matches:
                suffix = "" if match.query is None else f"_{match.query}"
                sites.append(SoftmaxSite(node, name + suffix, site_label(node, match.query), match,
                                         merged_site(context.index, match, context.values)))
        _mark_merged_in(context, sites)
        return sorted(sites, key=lambda site: site.within is not None)

    def replace(self, context: FusionContext, site: SoftmaxSite) -> Replacement | Rejected:
        index, node, match = context.index, site.anchor, site.match
        if isinstance(match, Rejected):
            if is_attention(index, node, context.depends_on_input):
                return Rejected(ATTENTION_REASON, kind=ATTENTION)
            return Rejected(match.reason, kind=None if logits_from_a_stack(index, node) else OTHER)
        if site.within is not None and site.within.merge_fused:
            return Replacement(None, len(match.sources), note=f"scores the partial of the merge fused as "
                                                              f"{site.within.name}", part_of=site.within.name)
        try:
            replacement = fuse_merged_or_plain(context, match, site.merged, site.name)
        except Rejected as exc:
            if len(match.sources) == 1 and is_attention(index, node, context.depends_on_input):
                return Rejected(ATTENTION_REASON, kind=ATTENTION)
            return Rejected(exc.reason, sources=len(match.sources))
        site.merge_fused = site.merged is not None and not replacement.partial
        return replacement

    def rewrite(self, model: onnx.ModelProto, plans: list[AggregateReplacement]) -> onnx.ModelProto:
        return apply_replacements(model, plans)


def _mark_merged_in(context: FusionContext, sites: list[SoftmaxSite]) -> None:
    """Set ``within`` of every one-source site whose softmax lies in the subgraph of another site's merge."""
    by_node = {id(context.index.producer.get(s.anchor.output[0])): s for s in sites
               if isinstance(s.match, SiteMatch) and len(s.match.sources) == 1 and s.match.query is None}
    for site in sites:
        if site.merged is None:
            continue
        try:
            nodes = extract_region(context.index, site.merged.sources, site.merged.output).nodes
        except Rejected:
            continue
        for node in nodes:
            inner = by_node.get(id(node))
            if inner is not None and inner.anchor is not site.anchor and inner.within is None:
                inner.within = site
