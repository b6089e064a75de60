"""What used to fail opaquely: --import from the current folder, index inputs given without a dtype, two model
files with the same default output, and convert-checkpoint's file modes."""

from __future__ import annotations

import json
import shutil
import stat
import sys
import textwrap

import onnx
import pytest
import torch
from onnx import helper
from typer.testing import CliRunner

from attnres_export.cli import app
from attnres_export.errors import ExportError
from attnres_export.exporter.foreign import ForeignOptions, example_input_dtype, load_foreign, load_pickled_module
from attnres_export.exporter.options import ExportOptions, refuse_default_output_of_another_source
from attnres_export.graphs.metadata import EXPORT_KEY
from attnres_export.graphs.onnx_utils import set_metadata

MODULE = """
import torch
from torch import nn


class Scorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 4)

    def forward(self, input_ids):
        return self.embed(input_ids).sum(-1)


class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3, 2))

    def forward(self, tokens):
        return tokens @ self.weight
"""


@pytest.fixture
def pickled(tmp_path, monkeypatch):
    """``make(name)`` pickles an instance of ``user_models.<name>``, a module that lives only in tmp_path (the
    current folder), and forgets the module again, as a fresh `attnres-export` process would not have it."""
    (tmp_path / "user_models.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.chdir(tmp_path)

    def make(name: str):
        sys.path.insert(0, str(tmp_path))
        try:
            import user_models

            path = tmp_path / f"{name.lower()}.pt"
            torch.save(getattr(user_models, name)(), path)
        finally:
            sys.path.remove(str(tmp_path))
            sys.modules.pop("user_models", None)
        return path

    yield make
    sys.modules.pop("user_models", None)


def test_import_finds_a_module_in_the_current_folder_and_leaves_sys_path_as_it_was(pickled):
    path = pickled("Scorer")
    before = list(sys.path)
    foreign = ForeignOptions({"input_ids": ([2, 5], None)}, trust_pickle=True, imports=["user_models"])
    module = load_pickled_module(path, foreign)
    assert type(module).__name__ == "Scorer" and sys.path == before


def test_a_module_nowhere_to_be_found_names_the_folder_searched(pickled, tmp_path):
    path = pickled("Scorer")
    foreign = ForeignOptions({"input_ids": ([2, 5], None)}, trust_pickle=True, imports=["no_such_models"])
    with pytest.raises(ExportError, match=f"--import no_such_models: .*looked in the current folder {tmp_path}"):
        load_pickled_module(path, foreign)


@pytest.mark.parametrize(("name", "given", "dtype"), [
    ("ids", None, "int64"), ("input_ids", None, "int64"), ("position_ids", None, "int64"),
    ("attention_mask", None, "int64"), ("token_type_ids", None, "int64"), ("x", None, "float32"),
    ("hidden_states", None, "float32"), ("ids", "float32", "float32"), ("x", "int32", "int32"),
])
def test_an_example_input_without_dtype_is_int64_when_its_name_reads_as_indices(name, given, dtype):
    assert example_input_dtype(name, given) == dtype


def test_an_index_input_given_without_dtype_is_exported_as_int64(pickled):
    path = pickled("Scorer")
    opts = ExportOptions(path, check=False)
    source = load_foreign("pickle", opts, ForeignOptions({"input_ids": ([2, 5], None)}, trust_pickle=True,
                                                         imports=["user_models"]))
    assert source.feeds["input_ids"].dtype == "int64" and source.feeds["input_ids"].shape == (2, 5)


def test_a_picked_dtype_the_module_rejects_says_how_to_spell_it(pickled):
    path = pickled("Mixer")
    opts = ExportOptions(path, check=False)
    with pytest.raises(ExportError, match=r"tokens:2,3:int64 had no :DTYPE .* x:2,16:float32"):
        load_foreign("pickle", opts, ForeignOptions({"tokens": ([2, 3], None)}, trust_pickle=True,
                                                    imports=["user_models"]))


def stamped_onnx(path, source_file: str):
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                                                [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                                [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]))
    set_metadata(model, EXPORT_KEY, json.dumps({"source_file": source_file}))
    onnx.save(model, str(path))
    return path


def test_a_default_output_exported_from_another_file_is_refused_naming_o(block2_checkpoint, tmp_path):
    mine = shutil.copy(block2_checkpoint, tmp_path / "mine.pt")
    existing = stamped_onnx(tmp_path / "mine.tensorrt.onnx", "mine.onnx")
    before = existing.read_bytes()
    result = CliRunner().invoke(app, ["export", str(mine)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "was exported from mine.onnx, not mine.pt" in lines[0] and "pass -o" in lines[0]
    assert existing.read_bytes() == before


def test_a_default_output_of_the_same_file_or_an_explicit_o_may_be_replaced(tmp_path):
    stamped_onnx(tmp_path / "mine.tensorrt.onnx", "mine.pt")
    refuse_default_output_of_another_source(ExportOptions(tmp_path / "mine.pt"))
    refuse_default_output_of_another_source(ExportOptions(tmp_path / "mine.pt2", tmp_path / "mine.tensorrt.onnx"))
    with pytest.raises(ExportError, match=r"exported from mine\.pt, not mine\.pt2"):
        refuse_default_output_of_another_source(ExportOptions(tmp_path / "mine.pt2"))


def test_convert_checkpoint_writes_the_weights_readable_like_config_json(block2_checkpoint, tmp_path):
    out = tmp_path / "folder"
    result = CliRunner().invoke(app, ["convert-checkpoint", str(block2_checkpoint), str(out), "--max-shard-mb", "0.01"])
    assert result.exit_code == 0, result.output
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()}
    assert len(modes) > 3 and len(set(modes.values())) == 1, modes
    assert modes["config.json"] & stat.S_IRGRP
