"""The comparison behind every ``test_assembled_*`` test: one checkpoint exported assembled and with
``--trace-whole``, both passing their parity check, compared on ONNX Runtime on the same inputs and by what
``attnres inspect`` reads (inputs, outputs, dims, opsets, target, attnres nodes by arity, export metadata), the
attnres nodes by name, type and input count, the count of each attnres op."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.dims import DimRange
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions, ExportResult
from attnres_export.graphs.inspect import summarize
from attnres_export.models import load_checkpoint
from attnres_export.parity.feeds import past_feed_maker

RANGES = {"batch": DimRange(1, 2, 3), "seq": DimRange(1, 5, 16)}
PLAIN_SHAPES = [(2, 5), (1, 1), (1, 16), (3, 7)]
"""(batch, seq): the optimum, a single token (an MoE's gather branch), the longest sequence, odd sizes."""
PAST_SHAPES = [(2, 5, 0), (3, 1, 7), (1, 1, 3), (1, 4, 3)]
"""(batch, seq, past): a prefill, decode steps after odd past lengths (one token: an MoE's gather branch)."""


@dataclasses.dataclass(frozen=True)
class Case:
    model: str
    dtype: str = "float32"
    with_past: bool = False
    fuse_norm: bool = False
    target: str = "tensorrt"

    def id(self) -> str:
        return "-".join([self.model, self.dtype, *(["with-past"] if self.with_past else []),
                         *(["fuse-norm"] if self.fuse_norm else []), self.target])


def example_folders(arch: str, folders: dict[str, tuple[str, int | None, int]], root: Path,
                    seed: int) -> dict[str, Path]:
    """``name -> (model_type, attn_res_block_size or None, layers)``: each written by ``arch``'s
    ``attnres example`` writer under ``root``, seeds counting up from ``seed``."""
    from attnres_export.models.registry import architecture

    entry = architecture(arch)
    return {name: entry.write_example_folder(model_type, root / name, seed + i, block, layers)[0]
            for i, (name, (model_type, block, layers)) in enumerate(folders.items())}


def _export(source: Path, out: Path, case: Case, trace_whole: bool) -> tuple[ExportResult, list[str]]:
    phases: list[str] = []
    opts = ExportOptions(source, out, target=case.target, dtype=case.dtype, with_past=case.with_past,
                         fuse_norm=case.fuse_norm, trace_whole=trace_whole, **RANGES)
    return export_checkpoint(opts, status=phases.append), phases


def attnres_nodes(path: Path) -> list[tuple[str, str, int]]:
    """(name, op type, input count) of every attnres node: TensorRT names its plugin layers after them."""
    return [(n.name, n.op_type, len(n.input)) for n in onnx.load(str(path), load_external_data=False).graph.node
            if n.domain in ("attnres", "trt.plugins")]


def _feeds(source: Path, case: Case) -> list[dict[str, np.ndarray]]:
    model, _ = load_checkpoint(source)
    if case.with_past:
        make = past_feed_maker(model.with_past(), case.dtype, seed=3)
        return [make(shape) for shape in PAST_SHAPES]
    return [model.random_inputs(b, t, np.random.default_rng([3, b, t])) for b, t in PLAIN_SHAPES]


def assert_same_model(source: Path, tmp_path: Path, case: Case, kinds: int) -> None:
    """``source`` exported both ways is one model; the assembled export traced ``kinds`` kinds of piece."""
    assembled, phases = _export(source, tmp_path / "assembled.onnx", case, trace_whole=False)
    whole, whole_phases = _export(source, tmp_path / "whole.onnx", case, trace_whole=True)
    assert any(p.startswith(f"tracing {kinds} kinds of piece once") for p in phases), phases
    assert any(p.startswith("tracing the whole") for p in whole_phases), whole_phases
    assert assembled.report.ok and whole.report.ok, (assembled.report.to_dict(), whole.report.to_dict())
    assert assembled.fused_by_type == whole.fused_by_type
    assert attnres_nodes(assembled.path) == attnres_nodes(whole.path)
    ours, theirs = (summarize(onnx.load(str(r.path), load_external_data=False)) for r in (assembled, whole))
    for field in ("opsets", "inputs", "outputs", "target", "fused_by_arity", "export_info"):
        assert getattr(ours, field) == getattr(theirs, field), field
    with OnnxRuntimeRunner(assembled.path) as a, OnnxRuntimeRunner(whole.path) as b:
        for feeds in _feeds(source, case):
            got, expected = a.infer(feeds), b.infer(feeds)
            assert list(got) == list(expected)
            for name, value in expected.items():
                assert got[name].shape == value.shape and got[name].dtype == value.dtype
                # The same ops on the same weights (weight-only Transpose/Cast/Neg/Exp folded as the whole-model
                # trace's constant folding folds them): ONNX Runtime returned identical bits on every case here; the
                # bar leaves room for a kernel that reorders a float32 reduction between the two graphs.
                scale = float(np.abs(value.astype(np.float64)).max())
                np.testing.assert_allclose(got[name].astype(np.float64), value.astype(np.float64), rtol=0,
                                           atol=4 * np.finfo(np.float32).eps * scale, err_msg=name)
