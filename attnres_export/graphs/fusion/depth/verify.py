"""Keeping a rewrite only when the fused node and the original subgraph agree (the bar of the sources' dtype,
docs/parity.md#pass-bars, judged by the injected ``Numerics``).

Three trials: the activations of the reference run, random sources of mixed scales, and random sources of the
scale of ``sqrt(eps)`` (where the RMS depends on eps, so a wrong eps cannot pass).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.dtypes import BY_ONNX
from attnres_export.graphs.fusion.depth.node import aggregate_node
from attnres_export.graphs.fusion.numerics import Agreement, Numerics
from attnres_export.graphs.fusion.probe import Evaluate
from attnres_export.ops.opset import DOMAIN, OPSET_VERSION


@dataclass
class Verdict:
    ok: bool
    reason: str
    worst: Agreement | None


class FusedEvaluator:
    """AttnResAggregate alone, run by ONNX Runtime through the NumPy reference op; ``score_weight`` is an input."""

    def __init__(self, sources: list[str], value: np.ndarray, storage: int, eps: float, numerics: Numerics,
                 fixed: dict[str, np.ndarray] | None = None) -> None:
        """``storage`` is the sources' element type in the graph (a bfloat16 graph runs emulated in float32, so
        the captured arrays do not say it); ``fixed`` sources are constants, fed their value whatever the
        trial (constants.py)."""
        self.names = [f"s{i}" for i in range(len(sources))]
        self.sources = sources
        self.fixed = fixed or {}
        self.dtype_name = BY_ONNX[storage].name if storage in BY_ONNX else "float32"
        elem = storage
        inputs = [oh.make_tensor_value_info("sw", TensorProto.FLOAT, [value.shape[-1]])]
        inputs += [oh.make_tensor_value_info(n, elem, list(value.shape)) for n in self.names]
        node = aggregate_node("fused", "sw", self.names, "h", eps)
        graph = oh.make_graph([node], "attnres_fused", inputs, [oh.make_tensor_value_info("h", elem, None)])
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid(DOMAIN, OPSET_VERSION)])
        self.session = numerics.open_session(model)

    def __call__(self, sw: np.ndarray, feeds: dict[str, np.ndarray]) -> np.ndarray:
        inputs = {n: self.fixed[s] if s in self.fixed else feeds[s]
                  for n, s in zip(self.names, self.sources, strict=True)}
        return self.session({"sw": sw.astype(np.float32), **inputs})["h"]


def verify(region: Evaluate, fused: FusedEvaluator, sw: np.ndarray, eps: float, captured: dict[str, np.ndarray],
           expected: np.ndarray, seed: int, numerics: Numerics) -> Verdict:
    """Compare the fused node with the original subgraph on three kinds of inputs."""
    rng = np.random.default_rng(seed)
    names = [n for n in dict.fromkeys(fused.sources) if n not in fused.fixed]
    example = captured[names[0]]
    trials = {"reference-run": (captured, expected)}
    mixed = {n: (rng.standard_normal(example.shape) * rng.uniform(0.3, 3.0)).astype(example.dtype) for n in names}
    trials["random"] = (mixed, None)
    if eps > 0:
        tiny = {n: (rng.standard_normal(example.shape) * math.sqrt(eps)).astype(example.dtype) for n in names}
        trials["eps-scale"] = (tiny, None)
    worst = None
    for trial, (feeds, reference) in trials.items():
        want = region(feeds) if reference is None else reference
        metrics = numerics.agree(np.asarray(fused(sw, feeds), dtype=np.float64), np.asarray(want, np.float64),
                                 fused.dtype_name)
        if worst is None or metrics.rel_l2 > worst.rel_l2:
            worst = metrics
        if not metrics.ok:
            return Verdict(False, f"differs from AttnResAggregate on {trial} inputs (rel L2 {metrics.rel_l2:.2g}, "
                                  f"cosine {metrics.cosine:.7f})", metrics)
    return Verdict(True, "", worst)

