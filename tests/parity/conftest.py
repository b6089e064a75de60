"""One tiny checkpoint exported once per session, with its conversions and a deliberately broken copy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from attnres_export.dims import DimRange
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.graphs.save import save_onnx_atomic
from attnres_export.graphs.targets import convert
from attnres_export.models import save_checkpoint
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example


@dataclass(frozen=True)
class Artifacts:
    checkpoint: Path
    tensorrt: Path
    portable: Path
    ort_trt: Path
    perturbed: Path


def perturb_largest_initializer(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose largest float initializer is scaled by 1.5: a mistake no pass bar may accept."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    target = max((i for i in out.graph.initializer if i.data_type == onnx.TensorProto.FLOAT),
                 key=lambda i: int(np.prod(i.dims)))
    target.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(target) * 1.5, target.name))
    return out


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Artifacts:
    root = tmp_path_factory.mktemp("parity")
    cfg = AttnResLMConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=16)
    checkpoint = root / "tiny.pt"
    save_checkpoint(make_example(cfg), cfg, checkpoint)
    tensorrt = root / "tiny.tensorrt.onnx"
    export_checkpoint(ExportOptions(checkpoint, tensorrt, batch=DimRange(1, 2, 3), seq=DimRange(1, 4, 16),
                                    check=False))
    model = onnx.load(str(tensorrt))
    paths = {"portable": root / "tiny.portable.onnx", "ort_trt": root / "tiny.ort-trt.onnx"}
    save_onnx_atomic(convert(model, "portable"), paths["portable"])
    save_onnx_atomic(convert(model, "ort-trt"), paths["ort_trt"])
    perturbed = root / "tiny.perturbed.onnx"
    onnx.save(perturb_largest_initializer(model), str(perturbed))
    return Artifacts(checkpoint, tensorrt, perturbed=perturbed, **paths)


@dataclass(frozen=True)
class PastArtifacts:
    checkpoint: Path
    with_past: Path


@pytest.fixture(scope="session")
def past_artifacts(artifacts) -> PastArtifacts:
    """The tiny checkpoint's with-past graph (docs/decode.md), exported once, unchecked."""
    with_past = artifacts.checkpoint.with_name("tiny.with-past.tensorrt.onnx")
    export_checkpoint(ExportOptions(artifacts.checkpoint, with_past, batch=DimRange(1, 2, 3), seq=DimRange(1, 4, 8),
                                    past=DimRange(0, 4, 8), with_past=True, check=False))
    return PastArtifacts(artifacts.checkpoint, with_past)
