"""What fusion returns: a verified replacement per fused site, an outcome per softmax, and the fused model with
counts keyed by the attnres op each pattern writes. Nothing here knows a particular pattern (pattern.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx

from attnres_export.graphs.fusion.classify import ATTENTION, OTHER


@dataclass
class Replacement:
    """A verified rewrite of one site: ``plan`` is the pattern's own description of its new nodes (handed back to
    its ``rewrite``), the rest is what the report says of the site."""

    plan: Any
    sources: int | None = None
    eps: float | None = None
    rel_l2: float | None = None
    note: str = ""
    """Why the site is fused only in part, when it is (``partial``)."""
    partial: bool = False
    part_of: str = ""
    """The fused node that replaces this site too (a one-key softmax scoring the partial of a two-phase merge):
    ``plan`` is None, and the site is counted as that node's, not as one of its own."""


@dataclass
class SiteOutcome:
    """What happened to one Softmax, and what it is: a site of the pattern writing ``op_type`` (its ``kind``, e.g.
    ``depth aggregation``), or, with ``op_type`` None, ``attention`` or ``other softmax`` left alone."""

    site: str
    fused: bool
    reason: str = ""
    sources: int | None = None
    eps: float | None = None
    rel_l2: float | None = None
    kind: str = OTHER
    partial: bool = False
    """Fused in part (a two-phase merge's phase 1 is one node, its merge with the partial stays standard ops)."""
    op_type: str | None = None
    part_of: str = ""
    """The fused node this site became part of (its own is none; see ``Replacement.part_of``)."""


def site_label(softmax: onnx.NodeProto, query: int | None = None) -> str:
    """What the report calls a site: its softmax, and the query when that softmax scores several at once."""
    label = softmax.name or softmax.output[0]
    return label if query is None else f"{label}[{query}]"


@dataclass
class FusionResult:
    model: onnx.ModelProto
    sites: list[SiteOutcome]
    values: dict[str, np.ndarray]
    """Every value of the graph fused on the feeds that drove the fusion (its outputs are the reference): the input
    graph, or that graph with the eps put back into its RMS norms when one divided a row of zeros by 0 (eps.py)."""
    kinds: dict[str, str] = field(default_factory=dict)
    """The kind of site of every registered pattern, keyed by the op it writes, in the order they ran."""
    warnings: dict[str, list[str]] = field(default_factory=dict)
    """What the user should know about the graph (e.g. RMS norms that lost their eps, eps.py), each warning with the
    places it applies to."""

    @property
    def fused_by_op(self) -> dict[str, int]:
        """Fused sites per attnres op (the nodes of that op in the fused model), for the ops with any."""
        counts = Counter(s.op_type for s in self.sites if s.fused and s.op_type and not s.part_of)
        return {op: counts[op] for op in self.kinds if counts[op]}

    def of_op(self, op_type: str) -> list[SiteOutcome]:
        """The sites of the pattern writing ``op_type``, fused or not (not those fused as part of another)."""
        return [s for s in self.sites if s.op_type == op_type and not s.part_of]

    def count(self, kind: str) -> int:
        return sum(s.kind == kind for s in self.sites)

    @property
    def unfused(self) -> list[SiteOutcome]:
        """Sites of any pattern left as standard ops, wholly or in part: they run, but slower and without the
        plugin."""
        return [s for s in self.sites if s.op_type and (not s.fused or s.partial)]

    def unfused_summary(self) -> str:
        """``5 depth aggregation site(s), 2 residual-score attention site(s)``: the unfused sites per kind."""
        counts = Counter(s.kind for s in self.unfused)
        return ", ".join(f"{counts[kind]} {kind} site(s)" for kind in self.kinds.values() if counts[kind])

    def to_dict(self) -> dict:
        by_op = {op: {"kind": kind, "found": len(sites := self.of_op(op)), "fused": sum(s.fused for s in sites),
                      "unfused": sum(not s.fused or s.partial for s in sites)}
                 for op, kind in self.kinds.items()}
        return {"fused_by_op": self.fused_by_op, "by_op": by_op, "attention": self.count(ATTENTION),
                "other": self.count(OTHER), "warnings": self.warnings, "sites": [asdict(s) for s in self.sites]}
