"""Exporting the foreign test models the two ways users do, and checking a fused ONNX against PyTorch."""

from __future__ import annotations

import contextlib
import functools
import io
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.graphs.fusion import FusionResult, random_feeds
from attnres_export.ops.opset import AGGREGATE, DOMAIN
from attnres_export.parity.fusion_checks import fuse_and_check
from attnres_export.parity.metrics import compare, tolerance_for
from attnres_export.parity.report import Report
from tests.graphs.fusion.foreign_models import example_ids


def dynamic_shapes() -> tuple:
    return ({0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("seq", min=1, max=64)},)


def save_program(model: torch.nn.Module, path: Path) -> Path:
    """``torch.export.save`` of ``model`` with dynamic batch and sequence (what a user hands to attnres-export)."""
    torch.export.save(torch.export.export(model, (example_ids(),), dynamic_shapes=dynamic_shapes()), path)
    return path


def plain_onnx(cls: type[torch.nn.Module], opset: int, static: bool = False) -> onnx.ModelProto:
    """``torch.onnx.export(dynamo=True)`` of ``cls()`` as a user would call it, without attnres (cached);
    ``static`` exports at the example shape only (no dynamic dims), so shape-only values fold to constants."""
    copy = onnx.ModelProto()
    copy.CopyFrom(_plain_onnx(cls, opset, static))
    return copy


@functools.cache
def _plain_onnx(cls: type[torch.nn.Module], opset: int, static: bool) -> onnx.ModelProto:
    model = cls().eval()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, (example_ids(),), dynamo=True,
                                    dynamic_shapes=None if static else dynamic_shapes(),
                                    input_names=["input_ids"], output_names=["logits"], opset_version=opset)
    return program.model_proto


def fuse(model: onnx.ModelProto, seed: int = 0) -> tuple[FusionResult, Report]:
    """Fuse ``model`` on random feeds and check the fused model against it, as ``attnres fuse`` does."""
    return fuse_and_check(model, random_feeds(model, seed), seed=seed)


def fused_count(model: onnx.ModelProto) -> int:
    return sum(n.op_type == AGGREGATE and n.domain == DOMAIN for n in model.graph.node)


def matches_torch(onnx_model: onnx.ModelProto, model: torch.nn.Module, batch: int = 3, seq: int = 6) -> bool:
    """The ONNX model against the float32 PyTorch model at a shape it was not traced at (docs/parity.md float32 bar)."""
    ids = example_ids(batch, seq, seed=1)
    with torch.inference_mode():
        expected = model(ids).numpy()
    with OnnxRuntimeRunner(onnx_model) as runner:
        got = next(iter(runner.infer({onnx_model.graph.input[0].name: ids.numpy()}).values()))
    return compare(np.asarray(got), expected, tolerance_for("float32")).ok
