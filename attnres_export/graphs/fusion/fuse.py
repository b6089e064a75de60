"""The driver: every registered pattern (pattern.py) in turn finds its sites among the softmaxes no earlier pattern
took, verifies a replacement for each and writes the verified ones into the model.

Running models and judging arrays is the injected ``Numerics``; comparing the whole fused model with the original
is the caller's (``attnres_export.parity.fusion_checks``).
"""

from __future__ import annotations

import numpy as np
import onnx

from attnres_export.graphs.fusion.context import FusionContext
from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.numerics import Numerics
from attnres_export.graphs.fusion.pattern import PATTERNS, FusionPattern
from attnres_export.graphs.fusion.result import FusionResult, Replacement, SiteOutcome
from attnres_export.graphs.onnx_utils import copy_model, default_opset
from attnres_export.graphs.schemas import register_schemas

MIN_SOFTMAX_OPSET = 13
"""Before opset 13 Softmax flattens its input to 2-D, which no pattern here is written for."""


def fuse_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray], numerics: Numerics,
               seed: int = 0) -> FusionResult:
    """Fuse every verified site of ``model``; ``feeds`` drive the reference run. Every softmax gets an outcome:
    the last pattern takes every softmax left (pattern.py)."""
    register_schemas()
    context = FusionContext.build(model, feeds, numerics, seed)
    kinds = {p.op_type: p.kind for p in PATTERNS}
    if default_opset(model) < MIN_SOFTMAX_OPSET:
        reason = f"Softmax of opset < {MIN_SOFTMAX_OPSET} is not handled"
        outcomes = [SiteOutcome(_label(node), False, reason) for node in context.softmaxes]
        return FusionResult(copy_model(model), outcomes, context.values, kinds)
    claimed: dict[int, SiteOutcome] = {}
    fused = model
    for pattern in PATTERNS:
        plans = []
        for site in pattern.sites(context, [n for n in context.softmaxes if id(n) not in claimed]):
            result = pattern.replace(context, site)
            claimed[id(site.anchor)] = _outcome(pattern, site.anchor, result)
            if not isinstance(result, Rejected):
                plans.append(result.plan)
        fused = pattern.rewrite(fused, plans)
    return FusionResult(fused, [claimed[id(node)] for node in context.softmaxes], context.values, kinds)


def _label(softmax: onnx.NodeProto) -> str:
    return softmax.name or softmax.output[0]


def _outcome(pattern: FusionPattern, anchor: onnx.NodeProto, result: Replacement | Rejected) -> SiteOutcome:
    if isinstance(result, Rejected):
        kind = result.kind or pattern.kind
        return SiteOutcome(_label(anchor), False, result.reason, sources=result.sources, kind=kind,
                           op_type=pattern.op_type if kind == pattern.kind else None)
    return SiteOutcome(_label(anchor), True, result.note, result.sources, result.eps, result.rel_l2, pattern.kind,
                       result.partial, pattern.op_type, list(result.warnings))
