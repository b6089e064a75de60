"""The weight store: a checkpoint opens without reading a tensor, each tensor reads as the file's own reader reads
it (experts stacked by the family view), a streamed export writes the same file as an export of the model held in
memory, and a command opens its checkpoint once."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch
from safetensors.torch import load_file

from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.models.decoder.example import write_example_folder
from attnres_export.models.kimi.k3_example import write_k3_example_folder
from attnres_export.models.store import checkpoint as store_checkpoint
from attnres_export.models.store import files, open_checkpoint
from tests.conftest import slow_after, write_checkpoint
from tests.models.decoder.hf_bodies import hf_model


def _counting_reads(monkeypatch) -> list[str]:
    """Every safetensors tensor read from now on, by name."""
    reads: list[str] = []
    real = files._safetensors_reader

    def counted(file: Path, name: str):
        read = real(file, name)

        def wrapped() -> torch.Tensor:
            reads.append(name)
            return read()

        return wrapped

    monkeypatch.setattr(files, "_safetensors_reader", counted)
    return reads


def _whole_folder(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a folder's shards, read whole by safetensors itself."""
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors |= load_file(str(shard))
    return tensors


def _published_moe_folder(path: Path, seed: int) -> Path:
    """transformers' own Qwen3-MoE ``save_pretrained``: experts stored one by one, as published, in shards."""
    hf_model("qwen3_moe", seed, mlp_only_layers=[]).save_pretrained(path, max_shard_size="20KB")
    assert (path / "model.safetensors.index.json").is_file()
    return path


def test_opening_a_sharded_moe_folder_reads_no_tensor_until_one_is_asked_for(tmp_path, monkeypatch):
    folder = _published_moe_folder(tmp_path / "moe", seed=1)
    reads = _counting_reads(monkeypatch)
    checkpoint = open_checkpoint(folder)
    assert reads == []
    name = "model.layers.0.mlp.experts.gate_up_proj"
    stored = checkpoint.tensors[name]
    assert reads == [] and stored.dtype == torch.float32 and stored.format == "dense"
    stored.read()
    assert len(reads) == 2 * checkpoint.config.moe.num_experts  # each expert's gate and up, once


def test_each_tensor_reads_as_safetensors_reads_the_folder_with_the_experts_stacked(tmp_path):
    folder = _published_moe_folder(tmp_path / "moe", seed=2)
    whole = _whole_folder(folder)
    checkpoint = open_checkpoint(folder)
    experts = checkpoint.config.moe.num_experts
    prefix = "model.layers.1.mlp."
    gate = torch.stack([whole[f"{prefix}experts.{j}.gate_proj.weight"] for j in range(experts)])
    up = torch.stack([whole[f"{prefix}experts.{j}.up_proj.weight"] for j in range(experts)])
    down = torch.stack([whole[f"{prefix}experts.{j}.down_proj.weight"] for j in range(experts)])
    assert torch.equal(checkpoint.tensors[prefix + "experts.gate_up_proj"].read(), torch.cat([gate, up], dim=1))
    assert torch.equal(checkpoint.tensors[prefix + "experts.down_proj"].read(), down)
    for name in ("model.embed_tokens.weight", "model.layers.1.self_attn.q_proj.weight", "lm_head.weight"):
        assert torch.equal(checkpoint.tensors[name].read(), whole[name]), name
    half = checkpoint.tensors["model.layers.1.self_attn.q_proj.weight"].read(torch.float16)
    assert half.dtype == torch.float16 and torch.equal(half, whole["model.layers.1.self_attn.q_proj.weight"].half())


def test_the_fingerprint_read_tensor_by_tensor_is_the_fingerprint_of_the_model_in_memory(tmp_path):
    from attnres_export.models.base import fingerprint

    checkpoint = open_checkpoint(_published_moe_folder(tmp_path / "moe", seed=3))
    assert checkpoint.fingerprint() == fingerprint(checkpoint.model(None))


def _source(kind: str, path: Path) -> Path:
    if kind == "attnres-lm":
        return write_checkpoint(path / "block.pt", n_layers=3, block_size=2)
    if kind == "kimi_k3":
        return write_k3_example_folder(path / "k3", seed=4, attn_res_block_size=3, layers=4)[0]
    return write_example_folder(kind, path / kind, seed=4, attn_res_block_size=2)[0]


@pytest.mark.parametrize(("kind", "with_past"), [
    *slow_after([("attnres-lm", False), ("attnres-lm", True), ("qwen3_moe", False)]),
    pytest.param("deepseek_v3", True, marks=[pytest.mark.slow, pytest.mark.full]),  # a MoE folder, as qwen3_moe's
    pytest.param("kimi_k3", True, marks=pytest.mark.slow),
])
def test_a_streamed_export_writes_the_file_an_export_of_the_model_in_memory_writes(tmp_path, monkeypatch, kind,
                                                                                   with_past):
    source = _source(kind, tmp_path)
    written = {}
    for streamed, resident in (("streamed", 0), ("in memory", 1 << 40)):
        monkeypatch.setattr(store_checkpoint, "RESIDENT_BYTES", resident)
        out = tmp_path / f"{streamed.replace(' ', '-')}.onnx"
        export_checkpoint(ExportOptions(source, out, dtype="float16", check=False, with_past=with_past))
        written[streamed] = out.read_bytes()
    assert written["streamed"] == written["in memory"]
    assert len(onnx.load_from_string(written["streamed"]).graph.initializer) > 10


def test_an_export_with_its_check_opens_the_checkpoint_once(tmp_path, monkeypatch):
    source = write_checkpoint(tmp_path / "block.pt", n_layers=2, block_size=2)
    opened = []
    real = files.read_payload
    monkeypatch.setattr(files, "read_payload", lambda path: opened.append(path) or real(path))
    result = export_checkpoint(ExportOptions(source, tmp_path / "m.onnx", dtype="float16"))
    assert result.report is not None and result.report.ok
    assert opened == [source]


@pytest.mark.slow
def test_a_genai_folder_with_its_check_opens_the_checkpoint_folder_once(tmp_path, monkeypatch):
    from attnres_export.exporter.foreign import ForeignOptions
    from attnres_export.exporter.genai import export_genai
    from attnres_export.models import hf_folder
    from tests.exporter.genai_helpers import write_family_folder

    folder = write_family_folder(tmp_path / "qwen3", "qwen3")
    opened = []
    real = hf_folder.safetensors_tensors
    monkeypatch.setattr(hf_folder, "safetensors_tensors", lambda path: opened.append(path) or real(path))
    result = export_genai(ExportOptions(folder, None, with_past=True, target="portable"), tmp_path / "genai",
                          ForeignOptions())
    assert result.report is not None and result.report.ok
    assert opened == [folder]


def test_a_hugging_face_cache_snapshot_of_links_into_its_blob_store_reads_like_the_folder(tmp_path):
    folder = _published_moe_folder(tmp_path / "moe", seed=5)
    blobs, snapshot = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "0123abc"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for index, file in enumerate(sorted(folder.iterdir())):
        blob = blobs / f"sha256-{index:04d}"
        blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(blob)
    linked, plain = open_checkpoint(snapshot), open_checkpoint(folder)
    assert linked.fingerprint() == plain.fingerprint()
    assert set(linked.tensors) == set(plain.tensors)
