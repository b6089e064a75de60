"""Fusing one matched depth-aggregation site: the score weight and eps read off it (probe.py), the fused node
checked against the original subgraph (verify.py), the two-phase merge tried first when there is one (merge.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper as oh

from attnres_export.graphs.fusion.context import FusionContext
from attnres_export.graphs.fusion.depth.constants import GraphConstants, fixed_sources
from attnres_export.graphs.fusion.depth.match import SiteMatch, query_axes
from attnres_export.graphs.fusion.depth.merge import normalized_site
from attnres_export.graphs.fusion.depth.rewrite import AggregateReplacement
from attnres_export.graphs.fusion.depth.verify import FusedEvaluator, verify
from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.graphs.fusion.numerics import Numerics
from attnres_export.graphs.fusion.probe import (
    ConstantOf,
    Evaluate,
    constant_candidates,
    eps_candidates,
    fit_single_source,
    probe_score_weight,
    snap_to_constants,
)
from attnres_export.graphs.fusion.region import extract_region, region_model
from attnres_export.graphs.fusion.result import Replacement


def fuse_merged_or_plain(context: FusionContext, match: SiteMatch, merged: SiteMatch | None,
                         name: str) -> Replacement:
    """The two-phase merge of ``match`` with its partial as one node (merge.py); when that merge does not verify,
    the phase-1 aggregation alone, with the reason the merge stays standard ops. A phase 1 kept unnormalized is
    fused merged, or up to its normalized result when it is not merged. Raises Rejected."""
    if match.normalizer is not None:
        target = merged or normalized_site(context.index, match, context.values)
        if target is None:
            raise Rejected(f"phase 1 is kept unnormalized (its sum of exponentials {match.normalizer!r} apart) and "
                           "neither its normalized result nor a merge with a partial sum into one follows it")
        return fuse_site(context, target, name)
    if merged is None:
        return fuse_site(context, match, name)
    try:
        return fuse_site(context, merged, name)
    except Rejected as exc:
        replacement = fuse_site(context, match, name)
        replacement.note = f"phase 1 only: its merge with {merged.sources[-1]!r} into {merged.output!r} is left " \
                           f"as standard ops ({exc})"
        replacement.partial = True
        return replacement


def fuse_site(context: FusionContext, match: SiteMatch, name: str) -> Replacement:
    """The verified AttnResAggregate of ``match``: the first eps candidate whose score weight verifies. Raises
    Rejected with the first reason met."""
    index, values, numerics, seed = context.index, context.values, context.numerics, context.seed
    fixed = fixed_sources(match.sources, GraphConstants(index), match.constants, context.constant_of)
    probed = [s for s in match.sources if s not in fixed]
    if not probed:
        raise Rejected("every source is a constant")
    example = values[probed[0]]
    evaluate = _evaluator(index, probed, match.output, values, numerics)
    logits = _logits(index, match, values, numerics) if len(match.sources) == 1 else None
    reasons = []
    region_nodes = extract_region(index, probed, match.output).nodes
    storage = context.types.get(probed[0], oh.np_dtype_to_tensor_dtype(example.dtype))
    for eps in eps_candidates(index, region_nodes, example.shape[-1]):
        try:
            candidates, unprobed = _score_weights(match, evaluate, logits, example, eps, seed, context.constant_of,
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
                plan = AggregateReplacement(name, match.sources, match.output, sw, eps, cast_to, match.constants)
                return Replacement(plan, len(match.sources), eps, verdict.worst.rel_l2 if verdict.worst else None)
            if unprobed is None:
                reasons.append(verdict.reason)
        if unprobed is not None:
            reasons.append(unprobed)
    raise Rejected(reasons[0])


def _score_weights(match: SiteMatch, evaluate: Evaluate, logits: list[Evaluate] | None, example: np.ndarray,
                   eps: float, seed: int, constant_of: ConstantOf, region_nodes: list[onnx.NodeProto],
                   fixed: set[str]) -> tuple[list[np.ndarray], str | None]:
    """Score weights to verify for one eps, and (when probing failed and the graph's constants stand in) why
    probing failed.

    A stack of one tensor repeated gives that tensor whatever the weights, so the graph's own constant (or zero)
    is exact. Otherwise the probe, snapped to the region's constants it matches; when probing fails for several
    sources (a saturated softmax), or matches no constant with eps 0 (where the logit gap no longer depends on the
    probe's size, so a large score weight comes back imprecise), the constants' products are tried directly. One
    source: a fit of each way the logits can hold the site's query. Raises Rejected when there is nothing to try."""
    dim = example.shape[-1]
    if len(set(match.sources)) == 1 and len(match.sources) > 1:
        return [*constant_candidates(constant_of, region_nodes, dim)[:1], np.zeros(dim)], None
    if logits is not None:
        fits, failures = [], []
        for evaluate_logits in logits:
            try:
                fits.append(fit_single_source(evaluate_logits, match.sources[0], example.shape, example.dtype, eps,
                                              seed))
            except Rejected as exc:
                failures.append(exc)
        if not fits:
            raise failures[0] if failures else Rejected("no axis of the logits holds one logit per token")
        return [c for sw in fits for c in _snapped(sw, eps, constant_of, region_nodes)], None
    try:
        sw = probe_score_weight(evaluate, [s for s in match.sources if s not in fixed], example.shape, example.dtype,
                                eps, zeros=sum(s in fixed for s in match.sources))
    except Rejected as exc:
        return constant_candidates(constant_of, region_nodes, dim), str(exc)
    return _snapped(sw, eps, constant_of, region_nodes), None


def _snapped(sw: np.ndarray, eps: float, constant_of: ConstantOf,
             region_nodes: list[onnx.NodeProto]) -> list[np.ndarray]:
    """The probed ``sw`` snapped to the region's constants; with eps 0 and no constant near, also the constants."""
    snapped = snap_to_constants(constant_of, region_nodes, sw)
    if snapped is not sw or eps > 0:
        return [snapped]
    return [sw, *constant_candidates(constant_of, region_nodes, sw.shape[0])]


def _logits(index: GraphIndex, match: SiteMatch, values: dict[str, np.ndarray], numerics: Numerics) -> list[Evaluate]:
    """The logits of a one-source site, one per token: for one query of a softmax scoring several, one evaluator per
    axis that can hold that query's logits."""
    logits = _evaluator(index, match.sources, match.softmax.input[0], values, numerics)
    if match.query is None:
        return [logits]
    source = values[match.sources[0]]
    axes = query_axes(values[match.softmax.input[0]].shape, match.query, source.size // source.shape[-1])
    return [lambda feeds, axis=axis: np.take(logits(feeds), match.query, axis=axis) for axis in axes]


def _evaluator(index: GraphIndex, sources: list[str], output: str, values: dict[str, np.ndarray],
               numerics: Numerics) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """Run the subgraph from ``sources`` to ``output`` alone, context values held fixed."""
    region = extract_region(index, sources, output)
    context = {n: values[n] for n in region.context}
    session = numerics.open_session(region_model(index, region, values))

    def evaluate(feeds: dict[str, np.ndarray]) -> np.ndarray:
        return session({**{n: feeds[n] for n in region.sources}, **context})[output]

    return evaluate
