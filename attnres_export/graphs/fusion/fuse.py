"""The driver: every registered pattern (pattern.py) in turn finds its sites among the softmaxes no earlier pattern
took, verifies a replacement for each and writes the verified ones into the model. Before that, RMS norms that lost
their eps to the exporter are looked for (eps.py): the user is warned, and when one divides a row of zeros by 0 they
all get it back.

Running models and judging arrays is the injected ``Numerics``; comparing the whole fused model with the original
is the caller's (``attnres_export.parity.fusion_checks``).
"""

from __future__ import annotations

import numpy as np
import onnx

from attnres_export.graphs.fusion.context import FusionContext
from attnres_export.graphs.fusion.eps import eps_free_norms, eps_warning, meet_zero_rows, restore_eps
from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.numerics import Numerics
from attnres_export.graphs.fusion.pattern import PATTERNS, FusionPattern, Site
from attnres_export.graphs.fusion.result import FusionResult, Replacement, SiteOutcome, site_label
from attnres_export.graphs.onnx_utils import copy_model, default_opset
from attnres_export.graphs.schemas import register_schemas

MIN_SOFTMAX_OPSET = 13
"""Before opset 13 Softmax flattens its input to 2-D, which no pattern here is written for."""


def fuse_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray], numerics: Numerics,
               seed: int = 0) -> FusionResult:
    """Fuse every verified site of ``model``; ``feeds`` drive the reference run. Every softmax gets an outcome (one
    per site, when a softmax scores several): the last pattern takes every softmax left (pattern.py)."""
    register_schemas()
    context = FusionContext.build(model, feeds, numerics, seed)
    norms = eps_free_norms(context.index)
    restored = meet_zero_rows(norms, context.values)
    if restored:
        model = restore_eps(model, norms, context.types)
        context = FusionContext.build(model, feeds, numerics, seed)
    kinds, warnings = {p.op_type: p.kind for p in PATTERNS}, eps_warning(norms, restored)
    if default_opset(model) < MIN_SOFTMAX_OPSET:
        reason = f"Softmax of opset < {MIN_SOFTMAX_OPSET} is not handled"
        outcomes = [SiteOutcome(site_label(node), False, reason) for node in context.softmaxes]
        return FusionResult(copy_model(model), outcomes, context.values, kinds, warnings)
    claimed: dict[int, list[SiteOutcome]] = {}
    fused = model
    for pattern in PATTERNS:
        plans = []
        for site in pattern.sites(context, [n for n in context.softmaxes if id(n) not in claimed]):
            result = pattern.replace(context, site)
            claimed.setdefault(id(site.anchor), []).append(_outcome(pattern, site, result))
            if not isinstance(result, Rejected) and result.plan is not None:
                plans.append(result.plan)
        fused = pattern.rewrite(fused, plans)
    outcomes = [outcome for node in context.softmaxes for outcome in claimed[id(node)]]
    return FusionResult(fused, outcomes, context.values, kinds, warnings)


def _outcome(pattern: FusionPattern, site: Site, result: Replacement | Rejected) -> SiteOutcome:
    if isinstance(result, Rejected):
        kind = result.kind or pattern.kind
        return SiteOutcome(site.label, False, result.reason, sources=result.sources, kind=kind,
                           op_type=pattern.op_type if kind == pattern.kind else None)
    return SiteOutcome(site.label, True, result.note, result.sources, result.eps, result.rel_l2, pattern.kind,
                       result.partial, pattern.op_type, result.part_of)
