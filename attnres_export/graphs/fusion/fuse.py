"""Finding every depth aggregation of a foreign AttnRes graph and replacing each by one AttnResAggregate node.

Every Softmax is a candidate site. A site is fused only when its structure matches (match.py), its subgraph
depends on nothing but its sources and constants (region.py), a score weight and eps can be read off it
(probe.py) and the fused node agrees with the original subgraph (verify.py). Running models and judging arrays
is the injected ``Numerics``; comparing the whole fused model with the original is the caller's
(``attnres_export.parity.fusion_checks``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import onnx
from onnx import helper as oh

from attnres_export.graphs.fusion.capture import capture_all
from attnres_export.graphs.fusion.classify import ATTENTION, DEPTH, OTHER, RESIDUAL, activations, classify_unmatched
from attnres_export.graphs.fusion.constants import GraphConstants, fixed_sources
from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.graphs.fusion.handwritten import handwritten_softmaxes
from attnres_export.graphs.fusion.match import SiteMatch, match_site
from attnres_export.graphs.fusion.merge import merged_site
from attnres_export.graphs.fusion.numerics import Numerics
from attnres_export.graphs.fusion.probe import (
    ConstantOf,
    constant_candidates,
    eps_candidates,
    fit_single_source,
    probe_score_weight,
    snap_to_constants,
)
from attnres_export.graphs.fusion.region import extract_region, region_model
from attnres_export.graphs.fusion.residual_rewrite import apply_residual_replacements
from attnres_export.graphs.fusion.residual_scores import fuse_residual_scores
from attnres_export.graphs.fusion.rewrite import Replacement, apply_replacements
from attnres_export.graphs.fusion.verify import FusedEvaluator, verify
from attnres_export.graphs.onnx_utils import default_opset
from attnres_export.graphs.schemas import register_schemas
from attnres_export.graphs.types import value_types

ATTENTION_REASON = "attention over tokens (scores from two activations), not a depth aggregation: left alone"
MIN_SOFTMAX_OPSET = 13
"""Before opset 13 Softmax flattens its input to 2-D, which no aggregation here is written for."""


@dataclass
class SiteOutcome:
    """What happened to one Softmax, and what it is (``depth aggregation``, ``residual-score attention``,
    ``attention`` or ``other softmax``)."""

    site: str
    fused: bool
    reason: str = ""
    sources: int | None = None
    eps: float | None = None
    rel_l2: float | None = None
    kind: str = DEPTH
    partial: bool = False
    """Fused in part: a two-phase merge's phase 1 is one node, its merge with the partial stays standard ops."""


@dataclass
class FusionResult:
    model: onnx.ModelProto
    sites: list[SiteOutcome]
    values: dict[str, np.ndarray]
    """Every value of the original graph on the feeds that drove the fusion (its outputs are the reference)."""

    @property
    def fused(self) -> int:
        """Fused depth aggregations: the AttnResAggregate nodes of the fused model."""
        return sum(s.fused and s.kind == DEPTH for s in self.sites)

    @property
    def fused_residual(self) -> int:
        """Fused residual-score attention layers: the ResidualScoreAttention nodes of the fused model."""
        return sum(s.fused and s.kind == RESIDUAL for s in self.sites)

    def count(self, kind: str) -> int:
        return sum(s.kind == kind for s in self.sites)

    @property
    def unfused_depth(self) -> list[SiteOutcome]:
        """Depth aggregations left as standard ops, wholly or in part: they run, but slower and without the
        plugin."""
        return [s for s in self.sites if s.kind == DEPTH and (not s.fused or s.partial)]

    def to_dict(self) -> dict:
        return {"sites_found": self.count(DEPTH), "fused": self.fused, "rejected": len(self.unfused_depth),
                "residual_attention": self.count(RESIDUAL), "residual_attention_fused": self.fused_residual,
                "attention": self.count(ATTENTION), "other": self.count(OTHER),
                "sites": [asdict(s) for s in self.sites]}


def fuse_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray], numerics: Numerics,
               seed: int = 0) -> FusionResult:
    """Fuse every verified aggregation of ``model``; ``feeds`` drive the reference run."""
    register_schemas()
    values = capture_all(model, feeds, numerics)
    index = GraphIndex(model)
    outcomes, replacements = [], []
    softmaxes = [n for n in index.nodes if n.op_type == "Softmax" and n.domain in ("", "ai.onnx")]
    softmaxes += handwritten_softmaxes(index)
    depends_on_input = activations(index)
    types = value_types(model)

    def constant_of(name: str) -> np.ndarray | None:
        value = index.constant(name)
        if value is None and name in values and not depends_on_input(name):
            value = values[name]
        return value

    residual, residual_outcomes = [], {}
    if default_opset(model) >= MIN_SOFTMAX_OPSET:
        residual, residual_outcomes = fuse_residual_scores(index, softmaxes, values, types, depends_on_input,
                                                           constant_of, numerics, seed)
    for number, node in enumerate(softmaxes):
        label = node.name or node.output[0]
        if default_opset(model) < MIN_SOFTMAX_OPSET:
            outcomes.append(SiteOutcome(label, False, f"Softmax of opset < {MIN_SOFTMAX_OPSET} is not handled",
                                        kind=OTHER))
            continue
        if (done := residual_outcomes.get(node.output[0])) is not None:
            outcomes.append(SiteOutcome(label, done.fused, done.reason, rel_l2=done.rel_l2, kind=RESIDUAL))
            continue
        try:
            match = match_site(index, node, values)
        except Rejected as exc:
            kind = classify_unmatched(index, node, depends_on_input)
            reason = ATTENTION_REASON if kind == ATTENTION else str(exc)
            outcomes.append(SiteOutcome(label, False, reason, kind=kind))
            continue
        try:
            replacement, outcome = _fuse_merged_or_plain(
                lambda site, name=f"attnres_fusion/aggregate_{number}": _fuse_site(
                    index, site, values, types, name, seed, numerics, constant_of),
                match, merged_site(index, match, values))
        except Rejected as exc:
            if len(match.sources) == 1 and classify_unmatched(index, node, depends_on_input) == ATTENTION:
                outcomes.append(SiteOutcome(label, False, ATTENTION_REASON, kind=ATTENTION))
            else:
                outcomes.append(SiteOutcome(label, False, str(exc), sources=len(match.sources)))
            continue
        replacements.append(replacement)
        outcomes.append(outcome)
    return FusionResult(apply_residual_replacements(apply_replacements(model, replacements), residual), outcomes,
                        values)


def _fuse_merged_or_plain(fuse_one: Callable[[SiteMatch], tuple[Replacement, SiteOutcome]], match: SiteMatch,
                          merged: SiteMatch | None) -> tuple[Replacement, SiteOutcome]:
    """The two-phase merge of ``match`` with its partial as one node (merge.py); when that merge does not verify,
    the phase-1 aggregation alone, with the reason the merge stays standard ops."""
    if merged is None:
        return fuse_one(match)
    try:
        return fuse_one(merged)
    except Rejected as exc:
        replacement, outcome = fuse_one(match)
        outcome.reason = f"phase 1 only: its merge with {merged.sources[-1]!r} into {merged.output!r} is left " \
                         f"as standard ops ({exc})"
        outcome.partial = True
        return replacement, outcome


def _fuse_site(index: GraphIndex, match: SiteMatch, values: dict[str, np.ndarray], types: dict[str, int], name: str,
               seed: int, numerics: Numerics, constant_of: ConstantOf) -> tuple[Replacement, SiteOutcome]:
    softmax = match.softmax
    fixed = fixed_sources(match.sources, GraphConstants(index), match.constants, constant_of)
    probed = [s for s in match.sources if s not in fixed]
    if not probed:
        raise Rejected("every source is a constant")
    example = values[probed[0]]
    evaluate = _evaluator(index, probed, match.output, values, numerics)
    logits = _evaluator(index, match.sources, softmax.input[0], values, numerics) if len(match.sources) == 1 \
        else None
    reasons = []
    region_nodes = extract_region(index, probed, match.output).nodes
    storage = types.get(probed[0], oh.np_dtype_to_tensor_dtype(example.dtype))
    for eps in eps_candidates(index, region_nodes, example.shape[-1]):
        try:
            candidates, unprobed = _score_weights(match, evaluate, logits, example, eps, seed, constant_of,
                                                  region_nodes, set(fixed))
        except Rejected as exc:
            reasons.append(str(exc))
            continue
        fused = FusedEvaluator(match.sources, example, storage, eps, numerics, fixed)
        for sw in candidates:
            verdict = verify(evaluate, fused, sw, eps, values, values[match.output], seed, numerics)
            if verdict.ok:
                result = values[match.output].dtype
                cast_to = None if result == example.dtype else oh.np_dtype_to_tensor_dtype(result)
                outcome = SiteOutcome(softmax.name or softmax.output[0], True, "", len(match.sources), eps,
                                      verdict.worst.rel_l2 if verdict.worst else None)
                return Replacement(name, match.sources, match.output, sw, eps, cast_to, match.constants), outcome
            if unprobed is None:
                reasons.append(verdict.reason)
        if unprobed is not None:
            reasons.append(unprobed)
    raise Rejected(reasons[0])


def _score_weights(match: SiteMatch, evaluate, logits, example: np.ndarray, eps: float, seed: int,
                   constant_of: ConstantOf, region_nodes: list[onnx.NodeProto],
                   fixed: set[str]) -> tuple[list[np.ndarray], str | None]:
    """Score weights to verify for one eps, and (when probing failed and the graph's constants stand in) why
    probing failed.

    A stack of one tensor repeated gives that tensor whatever the weights, so the graph's own constant (or zero)
    is exact. Otherwise the probe, snapped to the region's constants it matches; when probing fails for several
    sources (a saturated softmax), the constants' products are tried directly. Raises Rejected when there is
    nothing to try."""
    dim = example.shape[-1]
    if len(set(match.sources)) == 1 and len(match.sources) > 1:
        return [*constant_candidates(constant_of, region_nodes, dim)[:1], np.zeros(dim)], None
    try:
        sw = (fit_single_source(logits, match.sources[0], example.shape, example.dtype, eps, seed)
              if logits is not None else
              probe_score_weight(evaluate, [s for s in match.sources if s not in fixed], example.shape,
                                 example.dtype, eps, zeros=sum(s in fixed for s in match.sources)))
    except Rejected as exc:
        fallback = [] if logits is not None else constant_candidates(constant_of, region_nodes, dim)
        if not fallback:
            raise
        return fallback, str(exc)
    return [snap_to_constants(constant_of, region_nodes, sw)], None


def _evaluator(index: GraphIndex, sources: list[str], output: str, values: dict[str, np.ndarray],
               numerics: Numerics) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """Run the subgraph from ``sources`` to ``output`` alone, context values held fixed."""
    region = extract_region(index, sources, output)
    context = {n: values[n] for n in region.context}
    session = numerics.open_session(region_model(index, region, values))

    def evaluate(feeds: dict[str, np.ndarray]) -> np.ndarray:
        return session({**{n: feeds[n] for n in region.sources}, **context})[output]

    return evaluate
