"""Keeping a ResidualScoreAttention rewrite only when the fused node and the original subgraph agree on both
tensors it takes over, the attention output and the carried scores (the bar of q's storage dtype,
docs/parity.md#pass-bars, judged by the injected ``Numerics``).

Three trials: the activations of the reference run; random q, k, v of mixed scales and random previous scores
(where a wrong scale or divisor shows); and, with a mask, random mask values too (where a mask added at another
place than after the divisor shows, which a -10000 padding bias hides).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.dtypes import BY_ONNX
from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.graphs.fusion.numerics import Agreement, Numerics
from attnres_export.graphs.fusion.region import extract_region, region_model
from attnres_export.graphs.fusion.residual.rewrite import ResidualReplacement, attention_node, fused_io
from attnres_export.ops.opset import DOMAIN, OPSET_VERSION

Feeds = dict[str, np.ndarray]


@dataclass
class ResidualVerdict:
    ok: bool
    reason: str
    worst: Agreement | None


def _inputs(r: ResidualReplacement) -> list[str]:
    return [n for n in (r.q, r.key, r.v, r.prev, r.mask) if n]


class _Original:
    """The original subgraph from the site's inputs to its output and its scores, run alone."""

    def __init__(self, index: GraphIndex, r: ResidualReplacement, values: Feeds, numerics: Numerics) -> None:
        self.runs = []
        for output in (r.out, r.scores):
            region = extract_region(index, _inputs(r), output)
            context = {n: values[n] for n in region.context}
            self.runs.append((output, context, numerics.open_session(region_model(index, region, values))))

    def __call__(self, feeds: Feeds) -> tuple[np.ndarray, np.ndarray]:
        out, scores = (session({**feeds, **context})[output] for output, context, session in self.runs)
        return out, scores


class _Fused:
    """The fused node alone, fed the same tensors as the original subgraph (``k^T`` where the graph has it, previous
    scores and mask in their graph types)."""

    def __init__(self, r: ResidualReplacement, values: Feeds, numerics: Numerics) -> None:
        names = _inputs(r)
        inputs = [oh.make_tensor_value_info(n, r.types[n], list(values[n].shape)) for n in names]
        nodes = [oh.make_node("Transpose", [r.key], ["k"], perm=r.key_swap) if r.key_transposed
                 else oh.make_node("Identity", [r.key], ["k"])]
        optional = []
        for name in (r.prev, r.mask):
            if name and r.types[name] != TensorProto.FLOAT:
                nodes.append(oh.make_node("Cast", [name], [f"{name}/float"], to=TensorProto.FLOAT))
                name = f"{name}/float"
            optional.append(name or "")
        counter = itertools.count()
        fused_inputs, fused_outputs, before, after = fused_io(r, [r.q, "k", r.v, *optional], ["out", "scores"],
                                                            lambda prefix: f"{prefix}_{next(counter)}")
        nodes.extend([*before, attention_node("fused", fused_inputs, fused_outputs, r.scale, r.divisor), *after])
        outputs = [oh.make_tensor_value_info("out", r.types[r.q], None),
                   oh.make_tensor_value_info("scores", TensorProto.FLOAT, None)]
        graph = oh.make_graph(nodes, "attnres_fused_attention", inputs, outputs)
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid(DOMAIN, OPSET_VERSION)])
        self.session = numerics.open_session(model)

    def __call__(self, feeds: Feeds) -> tuple[np.ndarray, np.ndarray]:
        got = self.session(feeds)
        return got["out"], got["scores"]


def verify_attention(index: GraphIndex, r: ResidualReplacement, values: Feeds, seed: int,
                     numerics: Numerics) -> ResidualVerdict:
    """Compare the fused node with the original subgraph on the trials of this module's docstring."""
    original, fused = _Original(index, r, values, numerics), _Fused(r, values, numerics)
    dtype = BY_ONNX[r.types[r.q]].name if r.types[r.q] in BY_ONNX else "float32"
    worst = None
    for trial, feeds in _trials(r, values, seed).items():
        want = (values[r.out], values[r.scores]) if trial == "reference-run" else original(feeds)
        for what, got, expected in zip(("output", "scores"), fused(feeds), want, strict=True):
            metrics = numerics.agree(np.asarray(got, np.float64), np.asarray(expected, np.float64), dtype)
            if worst is None or metrics.rel_l2 > worst.rel_l2:
                worst = metrics
            if not metrics.ok:
                return ResidualVerdict(False, f"the {what} differs from ResidualScoreAttention(scale {r.scale:.6g}, "
                                              f"logit_divisor {r.divisor:.6g}) on {trial} inputs (rel L2 "
                                              f"{metrics.rel_l2:.2g}, cosine {metrics.cosine:.7f})", metrics)
    return ResidualVerdict(True, "", worst)


def _trials(r: ResidualReplacement, values: Feeds, seed: int) -> dict[str, Feeds]:
    rng = np.random.default_rng(seed)
    names = _inputs(r)
    trials = {"reference-run": {n: values[n] for n in names}}

    def like(name: str, scale: float) -> np.ndarray:
        return (rng.standard_normal(values[name].shape) * scale).astype(values[name].dtype)

    mixed = {n: like(n, rng.uniform(0.3, 3.0)) for n in (r.q, r.key, r.v)}
    if r.prev:
        mixed[r.prev] = like(r.prev, 2.0)
    if r.mask:
        mixed[r.mask] = values[r.mask]
    trials["random"] = mixed
    if r.mask:
        trials["random-mask"] = {**mixed, r.mask: like(r.mask, 2.0)}
    return trials


def element_types(names: list[str], types: dict[str, int], values: Feeds) -> dict[str, int]:
    """Declared element types of ``names`` (the captured arrays of an emulated bfloat16 graph are float32)."""
    return {n: types.get(n, oh.np_dtype_to_tensor_dtype(values[n].dtype)) for n in names}

