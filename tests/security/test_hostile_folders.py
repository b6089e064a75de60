"""Hostile checkpoint folders, tokenizers and files (the second probe set): each is refused in one line before any
heavy work, and nothing the input is made of is overwritten."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from attnres_export.models import load_checkpoint
from attnres_export.models.hf_folder import save_folder
from tests.conftest import write_checkpoint
from tests.security.test_hostile_inputs import invoke, one_line_error


@pytest.fixture
def folder(tmp_path) -> Path:
    model, cfg = load_checkpoint(write_checkpoint(tmp_path / "m.pt", n_layers=1))
    save_folder(model.state_dict(), cfg, tmp_path / "folder")
    return tmp_path / "folder"


@pytest.mark.parametrize("victim", ["model.safetensors", "config.json"])
def test_an_output_that_names_a_file_of_the_input_folder_is_refused_and_the_file_is_kept(folder, victim):
    before = (folder / victim).read_bytes()
    code, lines = invoke("export", folder, "-o", folder / victim, "--no-check")
    one_line_error(code, lines, victim, "same file")
    code, lines = invoke("check", folder, "--onnx", folder / victim, "--report", folder / victim)
    assert code != 0
    assert (folder / victim).read_bytes() == before


def test_an_oversized_safetensors_index_is_refused_without_reading_it(folder):
    index = folder / "model.safetensors.index.json"
    with index.open("wb") as handle:
        handle.truncate(1536 << 20)  # a sparse 1.5 GB file: reading it whole would take seconds and GBs
    started = time.monotonic()
    code, lines = invoke("export", folder, "-o", folder.parent / "m.onnx", "--no-check")
    one_line_error(code, lines, "model.safetensors.index.json", "MB")
    assert time.monotonic() - started < 20


def test_an_oversized_tokenizer_is_refused_without_reading_it(folder):
    with (folder / "tokenizer.json").open("wb") as handle:
        handle.truncate(1536 << 20)
    code, lines = invoke("generate", folder, "--prompt", "hello")
    one_line_error(code, lines, "tokenizer.json", "MB")


def test_a_layer_count_of_a_billion_is_refused_at_once(tmp_path):
    path = write_checkpoint(tmp_path / "ok.pt", n_layers=1)
    payload = torch.load(path, weights_only=True)
    payload["config"]["n_layers"] = 10**9
    torch.save(payload, tmp_path / "absurd.pt")
    started = time.monotonic()
    code, lines = invoke("export", tmp_path / "absurd.pt", "-o", tmp_path / "m.onnx")
    one_line_error(code, lines, "n_layers=1000000000")
    assert time.monotonic() - started < 20


def test_nan_stored_as_float8_e8m0_is_refused_by_its_type(tmp_path):
    """torch calls every float8_e8m0fnu value finite, its NaN (0xFF) included: no float8 type is read (yet)."""
    path = write_checkpoint(tmp_path / "ok.pt", n_layers=1)
    payload = torch.load(path, weights_only=True)
    nan = torch.full_like(payload["state_dict"]["norm.weight"], 255, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    payload["state_dict"]["norm.weight"] = nan
    torch.save(payload, tmp_path / "nan.pt")
    code, lines = invoke("export", tmp_path / "nan.pt", "-o", tmp_path / "m.onnx", "--no-check")
    one_line_error(code, lines, "norm.weight", "float8_e8m0fnu")


def test_a_corrupt_pickle_inside_a_pt_is_one_line(tmp_path):
    import zipfile

    path = write_checkpoint(tmp_path / "ok.pt", n_layers=1)
    data = bytearray(path.read_bytes())
    member = next(i for i in zipfile.ZipFile(path).infolist() if i.filename.endswith("data.pkl"))
    start = member.header_offset + 30 + len(member.filename) + len(member.extra)
    for offset in range(20, member.compress_size - 20, 37):
        data[start + offset] ^= 0x5A
    (tmp_path / "bad.pt").write_bytes(bytes(data))
    code, lines = invoke("export", tmp_path / "bad.pt", "-o", tmp_path / "m.onnx")
    one_line_error(code, lines, "bad.pt")


@pytest.mark.slow
def test_generate_refuses_the_with_past_onnx_of_another_model(tmp_path):
    from attnres_export.exporter.checkpoint import export_checkpoint
    from attnres_export.exporter.options import ExportOptions

    mine = write_checkpoint(tmp_path / "mine.pt", seed=1, n_layers=1, max_seq_len=16)
    other = write_checkpoint(tmp_path / "other.pt", seed=2, n_layers=1, max_seq_len=16)
    exported = export_checkpoint(ExportOptions(other, output=tmp_path / "other.onnx", with_past=True, check=False))
    code, lines = invoke("generate", mine, "--ids", "1,2", "--onnx", exported.path)
    one_line_error(code, lines, "another model")
    code, lines = invoke("generate", other, "--ids", "1,2", "--onnx", exported.path, "--json",
                         "--max-new-tokens", "8")
    assert code == 0 and len(json.loads(lines[-1])["tokens"]) == 8, lines
