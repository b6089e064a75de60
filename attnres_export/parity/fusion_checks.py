"""The numerics fusion runs with (ONNX Runtime, float32 bar), and the whole-model check of a fused graph."""

from __future__ import annotations

import numpy as np
import onnx

from attnres_export.backends.onnxruntime_runner import OnnxRuntimeRunner
from attnres_export.dtypes import STORAGE_TYPES
from attnres_export.graphs.fusion import FusionResult, Numerics, fuse_model
from attnres_export.graphs.fusion.numerics import Session
from attnres_export.parity.metrics import ErrorMetrics, compare, tolerance_for
from attnres_export.parity.report import Check, Report

Feeds = dict[str, np.ndarray]


def _open_session(model: onnx.ModelProto) -> Session:
    runner = OnnxRuntimeRunner(model)
    runner.activate()
    return runner.infer


def _agree(got: np.ndarray, want: np.ndarray) -> ErrorMetrics:
    return compare(got, want, tolerance_for("float32"))


def onnxruntime_numerics() -> Numerics:
    """Models run on ONNX Runtime CPU (attnres nodes through their NumPy reference), judged at the float32 bar."""
    return Numerics(_open_session, _agree)


def whole_model_parity(fused: onnx.ModelProto, feeds: Feeds, expected: Feeds, original: onnx.ModelProto,
                       artifact: str = "fused vs original") -> Report:
    """Every output of ``fused`` on ``feeds`` against ``expected`` (the original's outputs on the same feeds),
    each at the bar of its own dtype."""
    got = onnxruntime_numerics().run(fused, feeds)
    metrics = {}
    for output in original.graph.output:
        want = expected[output.name]
        dtype = str(want.dtype) if str(want.dtype) in STORAGE_TYPES else "float32"
        metrics[output.name] = compare(got[output.name], want, tolerance_for(dtype))
    shape = list(next(iter(feeds.values())).shape) if feeds else []
    return Report([Check(shape, "onnxruntime+ref-ops", artifact, "float32", metrics)])


def fuse_and_check(model: onnx.ModelProto, feeds: Feeds, seed: int = 0,
                   check: bool = True) -> tuple[FusionResult, Report | None]:
    """Fuse ``model`` and, unless ``check`` is off, compare the fused model with it on ``feeds``."""
    fusion = fuse_model(model, feeds, onnxruntime_numerics(), seed)
    if not check:
        return fusion, None
    return fusion, whole_model_parity(fusion.model, feeds, fusion.values, model)
