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
    warnings: list[str] = field(default_factory=list)
    """What the user should know about a site that verified (e.g. that the graph lost something the model has)."""


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
    warnings: list[str] = field(default_factory=list)


@dataclass
class FusionResult:
    model: onnx.ModelProto
    sites: list[SiteOutcome]
    values: dict[str, np.ndarray]
    """Every value of the original graph on the feeds that drove the fusion (its outputs are the reference)."""
    kinds: dict[str, str] = field(default_factory=dict)
    """The kind of site of every registered pattern, keyed by the op it writes, in the order they ran."""

    @property
    def fused_by_op(self) -> dict[str, int]:
        """Fused sites per attnres op (the nodes of that op in the fused model), for the ops with any."""
        counts = Counter(s.op_type for s in self.sites if s.fused and s.op_type)
        return {op: counts[op] for op in self.kinds if counts[op]}

    def of_op(self, op_type: str) -> list[SiteOutcome]:
        """The sites of the pattern writing ``op_type``, fused or not."""
        return [s for s in self.sites if s.op_type == op_type]

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

    @property
    def warnings(self) -> dict[str, list[str]]:
        """Each distinct warning of the sites, with the sites it applies to."""
        found: dict[str, list[str]] = {}
        for s in self.sites:
            for warning in s.warnings:
                found.setdefault(warning, []).append(s.site)
        return found

    def to_dict(self) -> dict:
        by_op = {op: {"kind": kind, "found": len(sites := self.of_op(op)), "fused": sum(s.fused for s in sites),
                      "unfused": sum(not s.fused or s.partial for s in sites)}
                 for op, kind in self.kinds.items()}
        return {"fused_by_op": self.fused_by_op, "by_op": by_op, "attention": self.count(ATTENTION),
                "other": self.count(OTHER), "warnings": self.warnings, "sites": [asdict(s) for s in self.sites]}
