"""The interface every fusion pattern implements, and the registered patterns in the order they run.

A pattern turns one kind of subgraph into one attnres op (docs/fusion.md#adding-a-fusion-pattern). The driver
(fuse.py) hands each pattern, in ``PATTERNS`` order, the softmaxes no earlier pattern took; the pattern says which
of them are its candidate sites, proposes and verifies a replacement for each (``Replacement``, or ``Rejected``
with the reason), and finally writes the verified replacements into the model. The driver counts the outcomes by
``op_type``; results, reports and the command line read only those counts and the outcomes' ``kind``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import onnx

from attnres_export.graphs.fusion.context import FusionContext
from attnres_export.graphs.fusion.depth.pattern import DepthAggregationPattern
from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.residual.pattern import ResidualScorePattern
from attnres_export.graphs.fusion.result import Replacement


class Site(Protocol):
    """One candidate site of a pattern."""

    anchor: onnx.NodeProto
    """The softmax the site is reported under (one of ``FusionContext.softmaxes``)."""
    label: str
    """What the report calls it (``result.site_label``: the softmax, and the query when it scores several)."""


class FusionPattern(Protocol):
    op_type: str
    """The attnres op a fused site becomes; outcomes and counts are keyed by it."""
    kind: str
    """What the report calls its sites (``depth aggregation``, ``residual-score attention``)."""

    def sites(self, context: FusionContext, softmaxes: Sequence[onnx.NodeProto]) -> Sequence[Site]:
        """The candidate sites among ``softmaxes`` (those no earlier pattern took); each is then reported under
        this pattern, fused or rejected, unless its rejection names another ``kind``."""
        ...

    def replace(self, context: FusionContext, site: Any) -> Replacement | Rejected:
        """The verified replacement of ``site``, or why it is left as it is."""
        ...

    def rewrite(self, model: onnx.ModelProto, plans: list[Any]) -> onnx.ModelProto:
        """A copy of ``model`` with the ``plan`` of every verified replacement written in, and what only the old
        subgraphs used removed."""
        ...


PATTERNS: tuple[FusionPattern, ...] = (ResidualScorePattern(), DepthAggregationPattern())
"""Residual-score attention first: it claims the attention softmaxes of a RealFormer, which the depth pattern would
otherwise report as attention. The depth pattern takes every softmax left, so it comes last."""
