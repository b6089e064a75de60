"""Adversarial inputs (docs/security.md): nothing untrusted runs, nothing good is lost, nothing crashes the
process. Every hostile file is made here; a marker file proves whether code from a file ran."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, numpy_helper
from onnx import helper as oh
from typer.testing import CliRunner

from attnres_export.cli import app
from attnres_export.cli.framework import command
from tests.conftest import write_checkpoint
from tests.security.hostile import save_program, with_pickled_sample_inputs, with_pickled_weight

runner = CliRunner()
CLI = [sys.executable, "-c", "from attnres_export.cli import main; main()"]


def invoke(*args) -> tuple[int, list[str]]:
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, [line for line in result.output.splitlines() if line.strip()]


def one_line_error(code: int, lines: list[str], *needles: str) -> None:
    assert code != 0 and len(lines) == 1, lines
    assert "Traceback" not in lines[0] and all(n in lines[0] for n in needles), lines[0]


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    return save_program(tmp_path_factory.mktemp("pt2") / "tiny.pt2")


@pytest.mark.parametrize("make", [with_pickled_weight, with_pickled_sample_inputs])
def test_a_pt2_with_pickled_members_is_refused_before_any_code_runs(make, program, tmp_path):
    marker = tmp_path / "code-ran"
    hostile = make(program, tmp_path / "hostile.pt2", marker)
    code, lines = invoke("export", hostile, "-o", tmp_path / "out.onnx")
    one_line_error(code, lines, "--trust-pickle", "unpickled")
    assert not marker.exists()
    assert not (tmp_path / "out.onnx").exists()


def test_a_pt2_of_plain_tensors_passes_the_inspection(program):
    from attnres_export.exporter.pt2_archive import unsafe_members

    assert unsafe_members(program) == []


def test_a_pickled_object_in_a_pt_says_it_needs_unpickling_and_what_trust_pickle_does(tmp_path):
    from tests.security.hostile import TouchOnLoad

    marker = tmp_path / "code-ran"
    torch.save({"format": TouchOnLoad(marker)}, tmp_path / "evil.pt")
    from attnres_export.errors import CheckpointError
    from attnres_export.models import load_checkpoint

    with pytest.raises(CheckpointError, match=r"needs full unpickling.*--trust-pickle"):
        load_checkpoint(tmp_path / "evil.pt")
    assert not marker.exists()


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    return write_checkpoint(tmp_path / "model.pt", n_layers=1, block_size=2)


@pytest.mark.slow
def test_a_failed_parity_check_keeps_the_good_file_and_writes_out_failed(checkpoint, tmp_path):
    out = tmp_path / "m.onnx"
    assert invoke("export", checkpoint, "-o", out, "--seq", "1:4:8")[0] == 0
    good = out.read_bytes()
    # A with-past graph is held to the fixed bar (a plain one's widens to float16 PyTorch's own error).
    code, lines = invoke("export", checkpoint, "-o", out, "--seq", "1:4:8", "--dtype", "float16", "--with-past",
                         "--tol", "float16:0:1", "--report", tmp_path / "r.json")
    assert code == 1 and "kept as" in lines[-1] and "was not written" in lines[-1]
    assert out.read_bytes() == good
    assert (tmp_path / "m.failed.onnx").is_file()
    assert '"onnx": "' + str(tmp_path / "m.failed.onnx") in (tmp_path / "r.json").read_text()


@pytest.mark.parametrize(("args", "needle"), [
    (["-o", "{ckpt}"], "same file as MODEL"),
    (["-o", "{out}", "--report", "{out}"], "--report"),
    (["-o", "/dev/null"], "not a regular file"),
    (["-o", "{tmp}"], "not a regular file"),
])
def test_outputs_that_alias_inputs_each_other_or_devices_are_refused(checkpoint, tmp_path, args, needle):
    before = checkpoint.read_bytes()
    values = {"ckpt": checkpoint, "out": tmp_path / "m.onnx", "tmp": tmp_path}
    code, lines = invoke("export", checkpoint, *[a.format(**values) for a in args])
    one_line_error(code, lines, needle)
    assert checkpoint.read_bytes() == before and not (tmp_path / "m.onnx").exists()


def _export_in_subprocess(checkpoint: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "export", str(checkpoint), "-o", str(out), "--seq", "1:4:8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_export_exits_128_plus_signal_and_leaves_no_debris(checkpoint, tmp_path, signum, code):
    out = tmp_path / "out" / "m.onnx"
    out.parent.mkdir()
    process = _export_in_subprocess(checkpoint, out)
    time.sleep(3)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    if out.exists():
        pytest.skip("the export finished before the signal arrived")
    assert process.returncode == code, stderr
    assert "Traceback" not in stderr
    assert list(out.parent.iterdir()) == []


@pytest.mark.slow
def test_debris_of_a_killed_run_is_removed_by_the_next_run_to_the_same_output(checkpoint, tmp_path):
    out = tmp_path / "m.onnx"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = tmp_path / f".m.onnx.{dead.stdout.strip()}.abcd1234"
    leftover.mkdir()
    (leftover / "m.onnx").write_bytes(b"half a model")
    alive = tmp_path / f".m.onnx.{os.getpid()}.alive123"
    alive.mkdir()
    assert invoke("export", checkpoint, "-o", out, "--no-check")[0] == 0
    assert not leftover.exists() and alive.exists()


def test_an_interrupt_that_surfaces_as_another_exception_still_exits_130():
    from attnres_export.cli import framework

    fake = __import__("typer").Typer()

    @command(fake, name="boom")
    def boom() -> None:
        framework._state["signal"] = signal.SIGINT
        raise AttributeError("partially initialized module 'torch' has no attribute 'onnx'")

    try:
        result = runner.invoke(fake, [])
    finally:
        framework._state["signal"] = None
    assert result.exit_code == 130 and "interrupted" in result.output


@pytest.mark.parametrize(("config", "needle"), [
    ({"n_layers": 10**6}, "n_layers=1000000"),
    ({"vocab_size": 10**9}, "vocab_size=1000000000"),
    ({"max_seq_len": 10**9}, "max_seq_len"),
    ({"eps": float("inf")}, "eps must be a finite number"),
])
def test_absurd_configs_are_refused_before_a_model_is_built(tmp_path, config, needle):
    path = write_checkpoint(tmp_path / "ok.pt", n_layers=1)
    payload = torch.load(path, weights_only=True)
    payload["config"].update(config)
    torch.save(payload, tmp_path / "absurd.pt")
    started = time.monotonic()
    code, lines = invoke("export", tmp_path / "absurd.pt", "-o", tmp_path / "m.onnx")
    one_line_error(code, lines, needle)
    assert time.monotonic() - started < 30


def test_nan_weights_are_refused_before_anything_is_written(tmp_path):
    path = write_checkpoint(tmp_path / "ok.pt", n_layers=1)
    payload = torch.load(path, weights_only=True)
    payload["state_dict"]["norm.weight"][0] = float("nan")
    torch.save(payload, tmp_path / "nan.pt")
    code, lines = invoke("export", tmp_path / "nan.pt", "-o", tmp_path / "m.onnx")
    one_line_error(code, lines, "norm.weight", "NaN")
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize(("args", "needle"), [
    (["--batch", "1:1:10000000"], "--batch"),
    (["--seq", "0:1:2"], "--seq"),
    (["--tol", "float32:-1:0.5"], "--tol"),
    (["--tol", "float32:1e-5:1.5"], "--tol"),
    (["--tol", "float32:inf:1"], "--tol"),
])
def test_out_of_range_options_are_one_line_naming_the_option(checkpoint, tmp_path, args, needle):
    code, lines = invoke("export", checkpoint, "-o", tmp_path / "m.onnx", *args)
    one_line_error(code, lines, needle)


def test_usage_errors_exit_2_with_one_plain_line_naming_the_option():
    result = subprocess.run([*CLI, "export", "model.pt", "--seed", "-3"], capture_output=True, text=True)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "--seed" in lines[0]
    assert not any(box in result.stderr for box in "╭│╰")


def _model_with_external_weight(folder: Path, location: str) -> Path:
    weight = numpy_helper.from_array(torch.ones(4).numpy(), "w")
    weight.data_location = TensorProto.EXTERNAL
    del weight.external_data[:]
    weight.external_data.add(key="location", value=location)
    weight.ClearField("raw_data")
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = oh.make_graph([oh.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], initializer=[weight])
    path = folder / "model.onnx"
    path.write_bytes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]).SerializeToString())
    return path


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "symlink"])
def test_external_data_outside_the_models_folder_is_refused_naming_the_location(tmp_path, kind):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\x00" * 16)
    folder = tmp_path / "models"
    folder.mkdir()
    location = {"absolute": str(secret), "dotdot": "../secret.bin", "symlink": "link.bin"}[kind]
    if kind == "symlink":
        (folder / "link.bin").symlink_to(secret)
    path = _model_with_external_weight(folder, location)
    for command_args in (["inspect", path], ["convert", path, "--target", "portable", "-o", tmp_path / "o.onnx"]):
        code, lines = invoke(*command_args)
        one_line_error(code, lines, location, "refusing")


def test_sparse_initializers_with_external_data_are_refused(tmp_path):
    values = numpy_helper.from_array(torch.ones(2).numpy(), "sv")
    values.data_location = TensorProto.EXTERNAL
    values.external_data.add(key="location", value="sparse.bin")
    values.ClearField("raw_data")
    (tmp_path / "sparse.bin").write_bytes(b"\x00" * 8)
    indices = numpy_helper.from_array(torch.tensor([0, 1]).numpy(), "si")
    sparse = oh.make_sparse_tensor(values, indices, [4])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = oh.make_graph([oh.make_node("Identity", ["sv"], ["y"])], "g", [], [y], sparse_initializer=[sparse])
    path = tmp_path / "sparse.onnx"
    path.write_bytes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]).SerializeToString())
    one_line_error(*invoke("inspect", path), "sparse tensor", "current directory")
    assert onnx.load(str(path), load_external_data=False).graph.sparse_initializer


def test_build_and_check_refuse_outputs_that_overwrite_their_inputs(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"not read: refused before")
    one_line_error(*invoke("build", model, "-o", model), "same file as ONNX")
    checkpoint = tmp_path / "m.pt"
    checkpoint.write_bytes(b"not read either")
    one_line_error(*invoke("check", checkpoint, "--onnx", model, "--report", checkpoint), "same file as MODEL")
    assert model.read_bytes() == b"not read: refused before" and checkpoint.read_bytes() == b"not read either"


def _model_with_local_function(folder: Path, domain: str, name: str) -> Path:
    """A valid AttnResAggregate node, and a model-local function ``domain::name`` whose body is an Identity."""
    from attnres_export.graphs.fusion.depth.node import aggregate_node
    from attnres_export.ops.opset import DOMAIN, OPSET_VERSION

    sw = numpy_helper.from_array(torch.ones(4).numpy(), "sw")
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    h = oh.make_tensor_value_info("h", TensorProto.FLOAT, [2, 4])
    graph = oh.make_graph([aggregate_node("agg", "sw", ["x", "x"], "h", 1e-6)], "g", [x], [h], initializer=[sw])
    body = oh.make_function(domain, name, ["score_weight", "source"], ["h"],
                            [oh.make_node("Identity", ["source"], ["h"])], [oh.make_opsetid("", 18)])
    imports = [oh.make_opsetid("", 18), oh.make_opsetid(DOMAIN, OPSET_VERSION)]
    if domain not in (DOMAIN, ""):
        imports.append(oh.make_opsetid(domain, 1))
    path = folder / "model.onnx"
    path.write_bytes(oh.make_model(graph, opset_imports=imports, functions=[body]).SerializeToString())
    return path


@pytest.mark.parametrize(("domain", "name"), [("attnres", "AttnResAggregate"), ("attnres", "ResidualScoreAttention"),
                                              ("attnres", "Helper"), ("mylib", "AttnResAggregate")])
def test_a_local_function_standing_in_for_an_attnres_op_is_refused_wherever_an_onnx_is_read(tmp_path, domain, name):
    """TensorRT before 10.7 runs a local function named like the op instead of the plugin: an Identity body would
    pass every check silently."""
    path = _model_with_local_function(tmp_path, domain, name)
    for command_args in (["inspect", path], ["convert", path, "--target", "tensorrt", "-o", tmp_path / "o.onnx"],
                         ["fuse", path, "-o", tmp_path / "f.onnx"]):
        code, lines = invoke(*command_args)
        one_line_error(code, lines, f"model-local function {domain}::{name}", "remove it")
    assert not (tmp_path / "o.onnx").exists() and not (tmp_path / "f.onnx").exists()


def test_a_local_function_of_another_domain_and_name_is_still_read(tmp_path):
    code, lines = invoke("inspect", _model_with_local_function(tmp_path, "mylib", "Gelu"))
    assert code == 0 and "AttnResAggregate" in "\n".join(lines)
