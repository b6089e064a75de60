"""Reading the score weight and eps of a candidate aggregation off the graph by evaluating it.

With sources ``u = d*e_k`` (once) and ``-u`` (all the others), AttnRes gives ``h = a*u + (1-a)*(-u)`` and
``logit(u) - logit(-u) = 2*d*sw_k / sqrt(d^2/D + eps)``, so every coordinate of ``sw`` (gain, query and any
constant logit scale folded together) follows from the weight ``a``. ``d`` is chosen so the logit gap stays
near 1 and the softmax never saturates. Whether the site really is AttnRes is checked afterwards (verify.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx

from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.ops.onnx_nodes import attribute

Evaluate = Callable[[dict[str, np.ndarray]], np.ndarray]
SINGLE_FIT_TOLERANCE = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 4e-2}
"""Relative residual of the one-source logit fit that the rounding of each storage dtype stays below."""
NORM_OPS = ("RMSNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
            "LayerNormalization")


def eps_candidates(index: GraphIndex, nodes: Sequence[onnx.NodeProto], dim: int) -> list[float]:
    """Values of eps the region may use: scalar constants it adds, normalization epsilons, each also over D
    (an L2 norm ``sqrt(sum + c)`` is the RMS with ``eps = c / D``); 0 when there are none."""
    found: list[float] = []
    for node in nodes:
        if node.op_type == "Add":
            for name in node.input:
                value = index.constant(name)
                if value is not None and value.size == 1 and np.issubdtype(value.dtype, np.floating):
                    found.append(float(value.ravel()[0]))
        elif node.op_type in NORM_OPS:
            found.append(float(attribute(node, "epsilon", 1e-5)))
    unique: list[float] = []
    for value in [v for c in found for v in (c, c / dim)]:
        if 0 < value < 0.1 and all(not math.isclose(value, u, rel_tol=1e-6) for u in unique):
            unique.append(value)
    return unique or [0.0]


def probe_score_weight(
    evaluate: Evaluate, sources: list[str], shape: tuple[int, ...], dtype: np.dtype, eps: float, zeros: int = 0
) -> np.ndarray:
    """``sw`` (float64) such that the region equals AttnResAggregate(sw, eps), if it is an aggregation at all.

    ``sources`` are the ones the region takes as inputs; ``zeros`` more are held at zero (constants.py): each
    weighs in with logit 0 and adds nothing to ``h``."""
    dim = shape[-1]
    probe_name = sources[0]
    same = sum(s == probe_name for s in sources)
    if same == len(sources) and not zeros:
        return np.zeros(dim)
    first = np.full(dim, 0.1 * math.sqrt(eps) if eps > 0 else 1.0)
    estimate = _measure(evaluate, sources, probe_name, (same, zeros), shape, dtype, eps, first)
    if eps <= 0:
        return estimate
    strength = 4 * estimate**2 - 1 / dim
    steps = np.where(strength > 0, np.sqrt(eps / np.maximum(strength, 1e-30)), 10 * math.sqrt(eps))
    return _measure(evaluate, sources, probe_name, (same, zeros), shape, dtype, eps,
                    np.minimum(steps, 10 * math.sqrt(eps)))


def _measure(evaluate: Evaluate, sources: list[str], probe_name: str, counts: tuple[int, int],
             shape: tuple[int, ...], dtype: np.dtype, eps: float, steps: np.ndarray) -> np.ndarray:
    dim, tokens = shape[-1], math.prod(shape[:-1])
    same, zeros = counts
    rest = len(sources) - same
    sw = np.zeros(dim)
    for start in range(0, dim, tokens):
        coords = np.arange(start, min(start + tokens, dim))
        which = coords[np.arange(tokens) % coords.size]
        delta = steps[which]
        probe = np.zeros((tokens, dim))
        probe[np.arange(tokens), which] = delta
        feeds = {name: (probe if name == probe_name else -probe).reshape(shape).astype(dtype)
                 for name in dict.fromkeys(sources)}
        real_delta = probe[np.arange(tokens), which].astype(dtype).astype(np.float64)
        h = np.asarray(evaluate(feeds), dtype=np.float64).reshape(tokens, dim)
        logit = _logit_of_probe(h[np.arange(tokens), which] / real_delta, same, rest, zeros)
        sw[which] = logit * np.sqrt(real_delta**2 / dim + eps) / real_delta
    return sw


def _logit_of_probe(t: np.ndarray, same: int, rest: int, zeros: int) -> np.ndarray:
    """``g`` from ``t = h_k / d = (same*y - rest/y) / (same*y + rest/y + zeros)`` with ``y = exp(g)`` (the logit
    of ``u``; ``-u`` has ``-g``, a zero source 0): the positive root of ``a*y^2 + b*y + c = 0``."""
    a, b, c = same * (1 - t), -zeros * t, -rest * (1 + t)
    if not np.all((t > -1) & (t < 1)):
        raise Rejected("probing the weights saturated the softmax or gave weights outside (0, 1)")
    q = -(b + np.where(b >= 0, 1.0, -1.0) * np.sqrt(b * b - 4 * a * c)) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.maximum(q / a, np.where(q != 0, c / np.where(q != 0, q, 1.0), 0.0))
    if not np.all(np.isfinite(y) & (y > 0)):
        raise Rejected("probing the weights saturated the softmax or gave weights outside (0, 1)")
    return np.log(y)


def fit_single_source(
    evaluate_logits: Evaluate, source: str, shape: tuple[int, ...], dtype: np.dtype, eps: float, seed: int
) -> np.ndarray:
    """``sw`` of a one-source site, read off its logits (its softmax is always 1, so ``h`` tells nothing).

    The logits must be ``v . sw / sqrt(mean(v^2) + eps)`` (plus a constant): a least-squares fit over tokens of
    random scale, at ordinary and at ``sqrt(eps)`` magnitude, must leave float32-level residuals.
    """
    rng = np.random.default_rng(seed)
    dim, tokens = shape[-1], math.prod(shape[:-1])
    scales = [1.0, math.sqrt(eps)] if eps > 0 else [1.0]
    rows, targets = [], []
    for scale in scales:
        for _ in range(math.ceil(2 * (dim + 1) / tokens)):
            v = rng.standard_normal((tokens, dim)) * rng.uniform(0.3, 3.0, (tokens, 1)) * scale
            v = v.astype(dtype).astype(np.float64)
            logits = np.asarray(evaluate_logits({source: v.reshape(shape).astype(dtype)}), dtype=np.float64)
            if logits.size != tokens:
                raise Rejected("the one-source softmax does not score each token once")
            rows.append(np.hstack([v / np.sqrt((v**2).mean(-1, keepdims=True) + eps), np.ones((tokens, 1))]))
            targets.append(logits.reshape(tokens))
    features, target = np.vstack(rows), np.concatenate(targets)
    solution = np.linalg.lstsq(features, target, rcond=None)[0]
    residual = np.linalg.norm(features @ solution - target) / max(np.linalg.norm(target), 1e-30)
    tolerance = SINGLE_FIT_TOLERANCE.get(np.dtype(dtype).name, SINGLE_FIT_TOLERANCE["float32"])
    if residual > tolerance:
        raise Rejected(f"the one-source logits are not r(v) * (v . sw) (fit residual {residual:.2g})")
    return solution[:dim]


FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
"""Constant dtypes a score weight can be made of (ml_dtypes' bfloat16 is no numpy floating subtype)."""
SNAP_TOLERANCE = 1e-3
"""Relative L2 within which a product of the region's constants is taken as the probed score weight."""


ConstantOf = Callable[[str], "np.ndarray | None"]
"""The value of a tensor that depends on no graph input (an initializer, or computed from initializers only)."""


def constant_candidates(constant_of: ConstantOf, nodes: Sequence[onnx.NodeProto], dim: int) -> list[np.ndarray]:
    """Score weights the region's constants can make: one [D] constant, or the product of two, times at most one
    scalar constant (or divided by it), in float64."""
    vectors, scalars = [], [1.0]
    for node in nodes:
        for name in node.input:
            value = constant_of(name)
            if value is None or value.dtype.name not in FLOAT_DTYPES:
                continue
            if value.size == dim:
                vectors.append(value.astype(np.float64).reshape(dim))
            elif value.size == 1 and value.ravel()[0] != 0:
                scalars.append(float(value.ravel()[0]))
    products = [*vectors, *(a * b for i, a in enumerate(vectors) for b in vectors[i + 1:])]
    return [candidate for vector in products for scale in scalars for candidate in (vector * scale, vector / scale)]


def snap_to_constants(constant_of: ConstantOf, nodes: Sequence[onnx.NodeProto], probed: np.ndarray) -> np.ndarray:
    """The score weight exactly as the graph's constants give it, when they do.

    Probing reads ``sw`` through float32 softmaxes, so each coordinate carries rounding that grows with the
    number of sources; an aggregation over many sources then fails its float32 check by a hair. ``sw`` is
    usually ``gain * query`` (times a scalar logit scale), all constants of the region: the candidate within
    SNAP_TOLERANCE of the probe is used instead. Verification still decides whether the site is fused.
    """
    norm = max(float(np.linalg.norm(probed)), 1e-30)
    best, best_error = probed, SNAP_TOLERANCE
    for candidate in constant_candidates(constant_of, nodes, probed.shape[0]):
        error = float(np.linalg.norm(candidate - probed)) / norm
        if error < best_error:
            best, best_error = candidate, error
    return best
