"""Error metrics and pass bars (docs/parity.md): against the float32 PyTorch reference, or against a float64 one
with a bar that scales with PyTorch's own error (float32, and for a 16-bit artifact PyTorch in that type)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from attnres_export.dtypes import STORAGE_TYPES, Tolerance


def tolerance_for(dtype: str, overrides: dict[str, Tolerance] | None = None) -> Tolerance:
    """The pass bar of ``dtype``: an override, else the default of docs/parity.md#pass-bars."""
    if overrides and dtype in overrides:
        return overrides[dtype]
    return STORAGE_TYPES[dtype].tolerance


@dataclass(frozen=True)
class ErrorMetrics:
    max_abs: float
    max_rel: float
    rel_l2: float
    cosine: float
    ok: bool
    pytorch_float32_rel_l2: float | None = None
    """With a float64 reference: float32 PyTorch's own relative L2 error, which scales the bar (scaled_tolerance)."""
    rel_l2_bar: float | None = None
    """The bar this output was judged against: relative L2 at most this (None: not judged, e.g. a missing output)."""
    cosine_bar: float | None = None
    """...and cosine at least this."""
    pytorch_same_type_rel_l2: float | None = None
    """For a 16-bit artifact against float64: PyTorch run in the artifact's type, its own relative L2 error (with
    float64's expert choices), which scales the bar too (scaled_tolerance)."""

    def to_dict(self) -> dict:
        return asdict(self)


DEPTH_FACTOR = 4.0
"""Against a float64 reference, an artifact may be this many times as far off as float32 PyTorch itself."""

SAME_TYPE_FACTOR = 2.0
"""...and a 16-bit artifact this many times as far off as PyTorch computing in the artifact's own type. Both
round every stored value to the same type, so their errors are of one size; they round at different places (a
graph rounds each op's output, PyTorch rounds inside its kernels too), which the factor allows for."""


def scaled_tolerance(tol: Tolerance, pytorch_float32: ErrorMetrics,
                     pytorch_same_type: ErrorMetrics | None = None) -> Tolerance:
    """The bar against a float64 reference: ``tol`` as a floor, widened to DEPTH_FACTOR times float32 PyTorch's
    own error and, for a 16-bit artifact, SAME_TYPE_FACTOR times the error of PyTorch in that type. Rounding grows
    with depth, so a fixed bar fails correct deep models (docs/parity.md#pass-bars). A non-finite own error
    (PyTorch overflowing in float16) widens nothing."""
    rel_l2, cosine = tol.rel_l2, tol.cosine
    for own, factor in ((pytorch_float32, DEPTH_FACTOR), (pytorch_same_type, SAME_TYPE_FACTOR)):
        if own is not None and np.isfinite(own.rel_l2) and np.isfinite(own.cosine):
            rel_l2 = max(rel_l2, factor * own.rel_l2)
            cosine = min(cosine, 1.0 - factor * (1.0 - own.cosine))
    return Tolerance(rel_l2, cosine)


def compare_scaled(out: np.ndarray, precise: np.ndarray, tol: Tolerance, pytorch_float32: ErrorMetrics,
                   pytorch_same_type: ErrorMetrics | None = None) -> ErrorMetrics:
    """``out`` against the float64 reference at the depth-scaled bar; the metrics record PyTorch's own errors."""
    metrics = compare(out, precise, scaled_tolerance(tol, pytorch_float32, pytorch_same_type))
    return replace(metrics, pytorch_float32_rel_l2=pytorch_float32.rel_l2,
                   pytorch_same_type_rel_l2=None if pytorch_same_type is None else pytorch_same_type.rel_l2)


def compare(out: np.ndarray, ref: np.ndarray, tol: Tolerance) -> ErrorMetrics:
    """Metrics of ``out`` against ``ref`` (both upcast to float64); NaN or Inf anywhere fails."""
    if out.shape != ref.shape:
        return ErrorMetrics(float("inf"), float("inf"), float("inf"), 0.0, False, rel_l2_bar=tol.rel_l2,
                            cosine_bar=tol.cosine)
    o = np.asarray(out, dtype=np.float64).ravel()
    r = np.asarray(ref, dtype=np.float64).ravel()
    diff = np.abs(o - r)
    finite = bool(np.isfinite(o).all())
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(np.abs(r), 1e-6)).max()) if diff.size else 0.0
    ref_norm = float(np.linalg.norm(r))
    rel_l2 = float(np.linalg.norm(o - r) / ref_norm) if ref_norm > 0 else float(np.linalg.norm(o - r))
    denom = float(np.linalg.norm(o)) * ref_norm
    cosine = float(np.dot(o, r) / denom) if denom > 0 else float(np.array_equal(o, r))
    ok = finite and rel_l2 <= tol.rel_l2 and cosine >= tol.cosine
    return ErrorMetrics(max_abs, max_rel, rel_l2, cosine, ok, rel_l2_bar=tol.rel_l2, cosine_bar=tol.cosine)
