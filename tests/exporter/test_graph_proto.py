"""The assembled graph's serializer (``exporter/graph_proto.py``: each copy of a traced node serialized from its
first copy's protos) writes the bytes onnx_ir's own serializer writes, on the staged graphs of real exports: the
project's model, a decoder body with experts (``If``/``Loop`` subgraphs, not copied) and Kimi Linear, plain and
with past."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx_ir import serde

from attnres_export.dims import DimRange
from attnres_export.exporter import staging
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.graph_proto import COPY_OF
from attnres_export.exporter.options import ExportOptions
from attnres_export.models.registry import architecture
from tests.conftest import slow_after, write_checkpoint


def _source(kind: str, root: Path) -> Path:
    if kind == "attnres-lm":
        return write_checkpoint(root / "model.pt", seed=3, n_layers=3, block_size=2)
    arch, model_type = {"qwen3_moe": ("decoder-lm", "qwen3_moe"), "kimi": ("kimi-linear", "kimi_linear")}[kind]
    return architecture(arch).write_example_folder(model_type, root / kind, 5, 2, 3)[0]


CASES = [(kind, with_past) for kind in ("attnres-lm", "qwen3_moe", "kimi") for with_past in (False, True)]


@pytest.mark.parametrize(("kind", "with_past"), slow_after(CASES))
def test_the_assembled_serializer_writes_the_bytes_onnx_ir_writes(kind, with_past, tmp_path, monkeypatch):
    compared = []
    serialize = staging.serialize_assembled

    def compare(model):
        copies = [node.meta[COPY_OF] for node in model.graph if COPY_OF in node.meta]
        assert len(copies) > len(set(copies)) > 0
        proto = serialize(model)
        assert proto.SerializeToString() == serde.serialize_model(model).SerializeToString()
        compared.append(kind)
        return proto

    monkeypatch.setattr(staging, "serialize_assembled", compare)
    opts = ExportOptions(_source(kind, tmp_path), tmp_path / "out.onnx", batch=DimRange(1, 2, 4),
                         seq=DimRange(1, 3, 16), with_past=with_past, check=False)
    export_checkpoint(opts)
    assert compared == [kind]
