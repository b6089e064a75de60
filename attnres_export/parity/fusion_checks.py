"""The numerics fusion runs with (ONNX Runtime, float32 bar), and the whole-model check of a fused graph."""

from __future__ import annotations

import numpy as np
import onnx

from attnres_export.backends.onnxruntime.isolated_run import crash_in_isolation
from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.dtypes import BY_ONNX, STORAGE_TYPES
from attnres_export.errors import ParityError
from attnres_export.graphs.fusion import FusionResult, Numerics, fuse_model
from attnres_export.graphs.fusion.feeds import symbolic_inputs
from attnres_export.graphs.fusion.numerics import Session
from attnres_export.ops.descriptors import is_attnres
from attnres_export.parity.metrics import ErrorMetrics, compare, tolerance_for
from attnres_export.parity.report import Check, Report

Feeds = dict[str, np.ndarray]


def _open_session(model: onnx.ModelProto) -> Session:
    runner = OnnxRuntimeRunner(model)
    runner.activate()
    return runner.infer


def _agree(got: np.ndarray, want: np.ndarray, dtype: str) -> ErrorMetrics:
    return compare(got, want, tolerance_for(dtype))


def onnxruntime_numerics() -> Numerics:
    """Models run on ONNX Runtime CPU (attnres nodes through their NumPy reference), judged at the bar of the
    sources' storage dtype."""
    return Numerics(_open_session, _agree)


def whole_model_parity(fused: onnx.ModelProto, feeds: Feeds, expected: Feeds, original: onnx.ModelProto,
                       artifact: str = "fused vs original", dtype: str | None = None) -> Report:
    """Every output of ``fused`` on ``feeds`` against ``expected`` (the original's outputs on the same feeds, or
    the float32 PyTorch reference's), at the bar of ``dtype`` (the exported precision), else of each output's
    declared type (a bfloat16 output comes back from the CPU emulation as float32 arrays)."""
    got = onnxruntime_numerics().run(fused, feeds)
    metrics = {}
    for output in original.graph.output:
        want = expected[output.name]
        declared = BY_ONNX.get(output.type.tensor_type.elem_type)
        bar = dtype or (declared.name if declared is not None else
                        str(want.dtype) if str(want.dtype) in STORAGE_TYPES else "float32")
        metrics[output.name] = compare(got[output.name], want, tolerance_for(bar))
    shape = list(next(iter(feeds.values())).shape) if feeds else []
    return Report([Check(shape, "onnxruntime+ref-ops", artifact, dtype or "float32", metrics)])


def refuse_crashing(model: onnx.ModelProto, feeds: Feeds, source: str) -> None:
    """Run a foreign model once in a separate process first: ONNX Runtime crashing on it (a segfault, an abort)
    must be one line, not the end of this process."""
    if any(is_attnres(node) for node in model.graph.node):
        return
    failure = crash_in_isolation(model.SerializeToString(), feeds)
    if failure is not None:
        raise ParityError(f"{source}: {failure}; the model cannot be fused or checked (is it a valid ONNX model "
                          "for ONNX Runtime's CPU provider?)")


def fuse_with_shape_hint(model: onnx.ModelProto, feeds: Feeds, seed: int) -> FusionResult:
    """``fuse_model``; when the first run fails on randomly sized symbolic dims, the error names the inputs whose
    shapes to give (a graph that is only nominally dynamic accepts just the sizes it was traced at)."""
    try:
        return fuse_model(model, feeds, onnxruntime_numerics(), seed)
    except ParityError as exc:
        guessed = symbolic_inputs(model)
        if not guessed:
            raise
        raise ParityError(f"{exc} (the symbolic dims of {', '.join(guessed)} were given made-up sizes; the graph may "
                          "accept only the sizes it was exported at: pass --example-shape NAME:d0,d1,... for "
                          f"{guessed[0]})") from exc


def fuse_and_check(model: onnx.ModelProto, feeds: Feeds, seed: int = 0,
                   check: bool = True) -> tuple[FusionResult, Report | None]:
    """Fuse ``model`` and, unless ``check`` is off, compare the fused model with it on ``feeds``."""
    refuse_crashing(model, feeds, "the model")
    fusion = fuse_with_shape_hint(model, feeds, seed)
    if not check:
        return fusion, None
    return fusion, whole_model_parity(fusion.model, feeds, fusion.values, model)
