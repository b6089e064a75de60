"""Finding every depth aggregation of a foreign AttnRes graph and replacing each by one AttnResAggregate node.

Every Softmax is a candidate site. A site is fused only when its structure matches (match.py), its subgraph
depends on nothing but its sources and constants (region.py), a score weight and eps can be read off it
(probe.py) and the fused node agrees with the original subgraph (verify.py). Then the whole fused model is
compared with the original on the same inputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import onnx
from onnx import helper as oh
from rich.table import Table

from attnres_export.graphs.fusion.capture import capture_all, run
from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.feeds import random_feeds
from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.graphs.fusion.match import match_site
from attnres_export.graphs.fusion.probe import eps_candidates, fit_single_source, probe_score_weight
from attnres_export.graphs.fusion.region import extract_region, region_model
from attnres_export.graphs.fusion.rewrite import Replacement, apply_replacements
from attnres_export.graphs.fusion.verify import FusedEvaluator, verify
from attnres_export.graphs.onnx_utils import default_opset
from attnres_export.graphs.schemas import register_schemas
from attnres_export.parity.metrics import DEFAULT_TOLERANCES, compare
from attnres_export.parity.report import Check, Report
from attnres_export.parity.runners import OnnxRuntimeRunner

MIN_SOFTMAX_OPSET = 13
"""Before opset 13 Softmax flattens its input to 2-D, which no aggregation here is written for."""


@dataclass
class SiteOutcome:
    """What happened to one Softmax."""

    site: str
    fused: bool
    reason: str = ""
    sources: int | None = None
    eps: float | None = None
    rel_l2: float | None = None


@dataclass
class FusionResult:
    model: onnx.ModelProto
    sites: list[SiteOutcome]
    parity: Report | None

    @property
    def fused(self) -> int:
        return sum(s.fused for s in self.sites)

    @property
    def ok(self) -> bool:
        return self.parity is None or self.parity.ok

    def to_dict(self) -> dict:
        return {"sites_found": len(self.sites), "fused": self.fused, "rejected": len(self.sites) - self.fused,
                "sites": [asdict(s) for s in self.sites],
                "parity": None if self.parity is None else self.parity.to_dict()}

    def table(self) -> Table:
        table = Table(title=f"Aggregation sites: {len(self.sites)} found, {self.fused} fused, "
                            f"{len(self.sites) - self.fused} rejected")
        for column in ("softmax", "sources", "result", "eps", "rel L2", "reason"):
            table.add_column(column)
        for s in self.sites:
            table.add_row(s.site, "" if s.sources is None else str(s.sources),
                          "[green]fused[/green]" if s.fused else "[yellow]rejected[/yellow]",
                          "" if s.eps is None else f"{s.eps:.3g}",
                          "" if s.rel_l2 is None else f"{s.rel_l2:.2g}", s.reason)
        return table


def fuse_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray] | None = None, seed: int = 0,
               check: bool = True) -> FusionResult:
    """Fuse every verified aggregation of ``model``; ``feeds`` (random by default) drive the reference run."""
    register_schemas()
    feeds = feeds if feeds is not None else random_feeds(model, seed)
    values = capture_all(model, feeds)
    index = GraphIndex(model)
    outcomes, replacements = [], []
    softmaxes = [n for n in index.nodes if n.op_type == "Softmax" and n.domain in ("", "ai.onnx")]
    for number, node in enumerate(softmaxes):
        label = node.name or node.output[0]
        if default_opset(model) < MIN_SOFTMAX_OPSET:
            outcomes.append(SiteOutcome(label, False, f"Softmax of opset < {MIN_SOFTMAX_OPSET} is not handled"))
            continue
        try:
            replacement, outcome = _fuse_site(index, node, values, f"attnres_fusion/aggregate_{number}", seed)
        except Rejected as exc:
            outcomes.append(SiteOutcome(label, False, str(exc)))
            continue
        replacements.append(replacement)
        outcomes.append(outcome)
    fused = apply_replacements(model, replacements)
    parity = whole_model_parity(fused, feeds, values, model) if check else None
    return FusionResult(fused, outcomes, parity)


def _fuse_site(index: GraphIndex, softmax: onnx.NodeProto, values: dict[str, np.ndarray], name: str,
               seed: int) -> tuple[Replacement, SiteOutcome]:
    match = match_site(index, softmax, values)
    example = values[match.sources[0]]
    single = len(set(match.sources)) == 1
    with contextlib.ExitStack() as stack:
        evaluate = _evaluator(stack, index, match.sources, match.output, values)
        logits = _evaluator(stack, index, match.sources[:1], softmax.input[0], values) if single else None
        reasons = []
        for eps in eps_candidates(index, extract_region(index, match.sources, match.output).nodes, example.shape[-1]):
            try:
                if logits is not None:
                    sw = fit_single_source(logits, match.sources[0], example.shape, example.dtype, eps, seed)
                else:
                    sw = probe_score_weight(evaluate, match.sources, example.shape, example.dtype, eps)
            except Rejected as exc:
                reasons.append(str(exc))
                continue
            fused = FusedEvaluator(match.sources, example, eps)
            verdict = verify(evaluate, fused, sw, eps, values, values[match.output], seed)
            if verdict.ok:
                result = values[match.output].dtype
                cast_to = None if result == example.dtype else oh.np_dtype_to_tensor_dtype(result)
                outcome = SiteOutcome(softmax.name or softmax.output[0], True, "", len(match.sources), eps,
                                      verdict.worst.rel_l2 if verdict.worst else None)
                return Replacement(name, match.sources, match.output, sw, eps, cast_to), outcome
            reasons.append(verdict.reason)
    raise Rejected(reasons[0])


def _evaluator(stack: contextlib.ExitStack, index: GraphIndex, sources: list[str], output: str,
               values: dict[str, np.ndarray]) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """Run the subgraph from ``sources`` to ``output`` alone (ONNX Runtime CPU), context values held fixed."""
    region = extract_region(index, sources, output)
    context = {n: values[n] for n in region.context}
    runner = stack.enter_context(OnnxRuntimeRunner(region_model(index, region, values)))

    def evaluate(feeds: dict[str, np.ndarray]) -> np.ndarray:
        return runner.infer({**feeds, **context})[output]

    return evaluate


def whole_model_parity(fused: onnx.ModelProto, feeds: dict[str, np.ndarray], values: dict[str, np.ndarray],
                       original: onnx.ModelProto) -> Report:
    """Every output of ``fused`` against ``values`` (the original's outputs on the same ``feeds``)."""
    got = run(fused, feeds)
    metrics = {}
    for output in original.graph.output:
        expected = values[output.name]
        dtype = str(expected.dtype) if str(expected.dtype) in DEFAULT_TOLERANCES else "float32"
        metrics[output.name] = compare(got[output.name], expected, DEFAULT_TOLERANCES[dtype])
    shape = list(next(iter(feeds.values())).shape) if feeds else []
    return Report([Check(shape, "onnxruntime+ref-ops", "fused vs original", "float32", metrics)])
