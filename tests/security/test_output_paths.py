"""Nothing good is lost (docs/security.md): every output, file or folder, and every ``.failed`` sibling is checked
against every input and every other output, and its folder is checked writable, before any work; a folder the
command did not write is never replaced; a file linked from outside the model folder is never copied into the
onnxruntime-genai folder, which is made to be shipped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from attnres_export.errors import AttnresError
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example
from attnres_export.models.hf_folder import save_folder
from tests.cli.test_cli import assert_one_line_error, invoke
from tests.conftest import SMALL, write_checkpoint
from tests.exporter.genai_helpers import write_tokenizer

GENAI = ("--with-past", "--target", "portable")
FAIL_CHECK = ("--tol", "float32:1e-30:1.0")
"""A bar no with-past graph meets (its bar is fixed, not widened to PyTorch's own float32 error)."""
EOS_ID = 2


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Everything under ``folder`` by relative path, with a file's bytes: what must be unchanged after a refusal."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def genai_checkpoint(tmp_path_factory) -> Path:
    """A one-layer checkpoint folder with a tokenizer and a generation config (what ``--genai`` needs; no token is
    generated to pick the end-of-sequence id, as the tests here never decode)."""
    folder = tmp_path_factory.mktemp("genai") / "ck"
    cfg = AttnResLMConfig(**{**SMALL, "n_layers": 1, "block_size": 2})
    save_folder(make_example(cfg, 3).state_dict(), cfg, folder)
    write_tokenizer(folder, cfg.vocab_size, EOS_ID)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS_ID}))
    return folder


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("small") / "m.pt", n_layers=1, block_size=2)


def test_a_user_folder_where_a_failed_genai_folder_would_be_kept_is_refused_before_the_export(genai_checkpoint,
                                                                                              tmp_path):
    mine = tmp_path / "out.failed"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    result = invoke("export", genai_checkpoint, *GENAI, "--genai", tmp_path / "out", *FAIL_CHECK)
    assert_one_line_error(result, f"{mine} exists and is not")
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["out.failed"]


def test_a_genai_folder_holding_files_the_export_did_not_write_is_refused_though_it_has_a_genai_config(
        genai_checkpoint, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "genai_config.json").write_text("{}")
    (folder / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    result = invoke("export", genai_checkpoint, *GENAI, "--genai", folder)
    assert_one_line_error(result, "notes.txt")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("report", ["out/genai_config.json", "out", "out.failed/report.json"])
def test_a_report_inside_the_genai_folder_or_its_failed_copy_is_refused_before_the_export(genai_checkpoint,
                                                                                          tmp_path, report):
    result = invoke("export", genai_checkpoint, *GENAI, "--genai", tmp_path / "out", "--report", tmp_path / report)
    assert_one_line_error(result, "--report")
    assert list(tmp_path.iterdir()) == []


def test_a_tokenizer_linked_from_outside_the_model_folder_is_refused_and_nothing_is_written(genai_checkpoint,
                                                                                          tmp_path):
    model = shutil.copytree(genai_checkpoint, tmp_path / "model")
    secret = tmp_path / "secret.json"
    (model / "tokenizer.json").rename(secret)
    (model / "tokenizer.json").symlink_to(secret)
    result = invoke("export", model, *GENAI, "--genai", tmp_path / "out")
    assert_one_line_error(result, "tokenizer.json is a link to")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("report", ["{file}/r.json", "{file}/deeper/r.json", "/proc/attnres-report.json"],
                         ids=["under-a-file", "deeper-under-a-file", "unwritable"])
def test_a_report_whose_folder_cannot_be_made_or_written_is_refused_before_the_good_output_is_replaced(
        small_checkpoint, tmp_path, report):
    good = tmp_path / "m.onnx"
    good.write_bytes(b"a good model")
    (tmp_path / "file").write_text("a file")
    result = invoke("export", small_checkpoint, "-o", good, "--report", report.format(file=tmp_path / "file"))
    assert_one_line_error(result, "--report")
    assert good.read_bytes() == b"a good model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "m.onnx"]


@pytest.mark.parametrize(("args", "needle"), [
    (["-o", "{tmp}/m.onnx", "--report", "{tmp}/m.failed.onnx.data"], "the failed copy of -o's data file"),
    (["-o", "{tmp}/m.onnx", "--report", "{tmp}/m.failed.onnx"], "the failed copy of -o"),
    (["-o", "{tmp}/m.onnx", "--report", "{tmp}/m.onnx.data"], "-o's data file"),
])
def test_an_output_that_is_the_failed_copy_or_the_data_file_of_another_is_refused(small_checkpoint, tmp_path, args,
                                                                                  needle):
    model = shutil.copyfile(small_checkpoint, tmp_path / "m.failed.pt")
    result = invoke("export", model, *[a.format(tmp=tmp_path) for a in args])
    assert_one_line_error(result, needle)
    assert model.read_bytes() == small_checkpoint.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.failed.pt"]


def test_a_model_where_the_failed_copy_would_go_is_refused_so_a_failed_check_cannot_replace_it(small_checkpoint,
                                                                                               tmp_path):
    model = shutil.copyfile(small_checkpoint, tmp_path / "m.failed.pt")
    result = invoke("export", model, "-o", tmp_path / "m.pt", "--with-past", *FAIL_CHECK)
    assert_one_line_error(result, "is the same file as MODEL")
    assert model.read_bytes() == small_checkpoint.read_bytes()


@pytest.mark.parametrize(("command", "needle"), [
    (["convert", "{model}", "--target", "portable", "-o", "{file}/x.onnx"], "-o"),
    (["fuse", "{model}", "-o", "{file}/x.onnx"], "-o"),
    (["check", "{model}", "--onnx", "{file}", "--report", "{file}/r.json"], "--report"),
    (["convert-checkpoint", "{model}", "{file}/out"], "OUT_DIR"),
    (["example", "{file}/x.pt"], "OUTPUT"),
    (["example", "{file}/out", "--arch", "qwen3"], "OUTPUT"),
])
def test_every_command_refuses_an_output_under_a_regular_file_in_one_line_before_any_work(small_checkpoint,
                                                                                         tmp_path, command, needle):
    (tmp_path / "file").write_text("a file")
    result = invoke(*[a.format(model=small_checkpoint, file=tmp_path / "file") for a in command])
    assert_one_line_error(result, needle)
    assert "cannot be made" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_the_python_api_refuses_an_output_under_a_regular_file_before_tracing(tmp_path):
    from attnres_export.api import export

    traced = []

    class Doubler(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            traced.append(True)
            return x * 2

    (tmp_path / "file").write_text("a file")
    with pytest.raises(AttnresError, match="cannot be made"):
        export(Doubler(), (torch.ones(2, 4),), tmp_path / "file" / "m.onnx")
    assert not traced


def test_a_convert_checkpoint_folder_that_is_a_link_is_refused(small_checkpoint, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    assert_one_line_error(invoke("convert-checkpoint", small_checkpoint, tmp_path / "link"), "OUT_DIR")
    assert (tmp_path / "link").is_symlink() and list((tmp_path / "empty").iterdir()) == []


def test_a_plugin_build_into_a_folder_it_did_not_write_is_refused_before_anything_there_is_removed(tmp_path):
    """A build removes an earlier build's ``tensorrt-*`` folders: in ``--out ~/opt`` that could be a TensorRT
    install."""
    (tmp_path / "tensorrt-10.7" / "include").mkdir(parents=True)
    (tmp_path / "tensorrt-10.7" / "include" / "NvInfer.h").write_text("// mine")
    before = snapshot(tmp_path)
    result = invoke("plugin", "build", "--out", tmp_path)
    assert_one_line_error(result, "tensorrt-10.7/include, which no plugin build wrote")
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_a_tokenizer_linked_inside_the_model_folder_is_copied_as_a_file(genai_checkpoint, tmp_path):
    model = shutil.copytree(genai_checkpoint, tmp_path / "model")
    (model / "tokenizer.json").rename(model / "tokenizer.v2.json")
    (model / "tokenizer.json").symlink_to("tokenizer.v2.json")
    assert invoke("export", model, *GENAI, "--genai", tmp_path / "out").exit_code == 0
    copied = tmp_path / "out" / "tokenizer.json"
    assert not copied.is_symlink() and copied.read_bytes() == (model / "tokenizer.v2.json").read_bytes()
