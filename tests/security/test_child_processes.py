"""No code from the user's folder runs in a process attnres starts (docs/security.md#nothing-untrusted-runs).

The commands run from a folder holding a planted ``numpy.py``, ``onnxruntime.py`` and ``attnres_export/``, each of
which leaves a marker file when imported: no Python child has the working directory on sys.path (and each loads the
package from where its parent loaded it), Triton starts outside the user's folder, and a child that fails before
it runs the model is reported in one line, never taken for a model that ran.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh
from typer.testing import CliRunner

from attnres_export import spawn
from attnres_export.cli import app, export_app
from tests.serve.conftest import NEEDS_SERVER

runner = CliRunner()
PLANTED = ("numpy", "onnxruntime", "attnres_export")
PAYLOAD = """\
import pathlib
pathlib.Path({folder!r}, "ran-{name}").touch()
raise ImportError("the planted {name} ran")
"""


def plant(folder: Path) -> Path:
    """``folder`` holding modules that shadow NumPy, ONNX Runtime and this package, each leaving ``ran-NAME``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in PLANTED:
        target = folder / name / "__init__.py" if name == "attnres_export" else folder / f"{name}.py"
        target.parent.mkdir(exist_ok=True)
        target.write_text(PAYLOAD.format(folder=str(folder), name=name))
    return folder


def markers(*folders: Path) -> list[str]:
    return sorted(p.name for folder in folders for p in folder.glob("ran-*"))


def small_onnx(path: Path) -> Path:
    """A foreign model (no attnres node): what ``attnres fuse`` first runs in a separate process."""
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    graph = oh.make_graph([oh.make_node("Softmax", ["x"], ["y"], axis=-1)], "g", [x], [y])
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]), str(path))
    return path


def cli(script: str, function: str) -> list[str]:
    """The console script a user runs (its sys.path starts with its own folder, not the working directory), else
    the same entry point with nothing of the working directory importable."""
    found = shutil.which(script, path=str(Path(sys.executable).parent))
    if found:
        return [found]
    root = str(Path(__file__).resolve().parents[2])
    return [sys.executable, "-I", "-c", f"import sys; sys.path.append({root!r}); "
                                        f"from attnres_export.cli import {function}; {function}()"]


def test_attnres_fuse_run_from_a_folder_of_planted_modules_runs_none_of_them(tmp_path):
    folder = plant(tmp_path / "work")
    small_onnx(folder / "model.onnx")
    proc = subprocess.run([*cli("attnres", "main"), "fuse", "model.onnx", "-o", "fused.onnx"], cwd=folder,
                          capture_output=True, text=True, timeout=600)
    assert markers(folder) == []
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (folder / "fused.onnx").is_file()


def test_attnres_export_of_a_foreign_onnx_from_a_folder_of_planted_modules_runs_none_of_them(tmp_path, monkeypatch):
    folder = plant(tmp_path / "work")
    small_onnx(folder / "model.onnx")
    monkeypatch.chdir(folder)
    result = runner.invoke(export_app, ["model.onnx", "-o", "out.onnx"])
    assert markers(folder) == []
    assert result.exit_code == 0, result.output
    assert (folder / "out.onnx").is_file()


@pytest.mark.slow
def test_attnres_export_of_a_pt2_from_a_folder_of_planted_modules_runs_none_of_them(tmp_path, monkeypatch):
    from tests.security.hostile import save_program

    folder = plant(tmp_path / "work")
    save_program(folder / "tiny.pt2")
    monkeypatch.chdir(folder)
    result = runner.invoke(export_app, ["tiny.pt2", "-o", "out.onnx"])
    assert markers(folder) == []
    assert result.exit_code == 0, result.output


def test_a_child_runs_the_attnres_export_its_parent_loaded_installed_or_not(tmp_path):
    """An uninstalled checkout (a copy beside a planted numpy.py) run from a planted folder: the child runs the
    copy's code, and nothing else of either folder."""
    checkout = plant(tmp_path / "checkout")
    shutil.rmtree(checkout / "attnres_export")
    shutil.copytree(spawn.PACKAGE_DIR, checkout / "attnres_export", ignore=shutil.ignore_patterns("__pycache__"))
    isolated = checkout / "attnres_export" / "backends" / "onnxruntime" / "isolated_run.py"
    ran = tmp_path / "the-copy-ran"
    source = isolated.read_text()
    assert "def main(argv: list[str]) -> int:\n" in source
    isolated.write_text(source.replace("def main(argv: list[str]) -> int:\n",
                                       f"def main(argv: list[str]) -> int:\n    Path({str(ran)!r}).touch()\n"))
    folder = plant(tmp_path / "work")
    model = small_onnx(tmp_path / "model.onnx")
    parent = (f"import sys; sys.path.append({str(checkout)!r})\n"
              "import numpy as np\n"
              "from attnres_export.backends.onnxruntime.isolated_run import crash_in_isolation\n"
              f"print(crash_in_isolation(open({str(model)!r}, 'rb').read(), {{'x': np.ones((2, 4), np.float32)}}))")
    proc = subprocess.run([sys.executable, "-I", "-c", parent], cwd=folder, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stdout + proc.stderr
    assert ran.exists()
    assert markers(folder, checkout) == []


def test_every_python_child_the_package_starts_leaves_the_working_directory_off_sys_path(tmp_path, monkeypatch):
    """Standard-library code runs with ``-I``; the package's modules through the bootstrap, whose first statement
    removes the "" Python puts first on sys.path for ``-c``."""
    from attnres_export.backends.onnxruntime import isolated_run
    from attnres_export.backends.tensorrt import verify_embedded
    from attnres_export.serve.workspace import ServeWorkspace

    commands: list[list[str]] = []

    def record(command, **kwargs):
        commands.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(isolated_run.subprocess, "run", record)
    monkeypatch.setattr(verify_embedded.subprocess, "run", record)
    isolated_run.crash_in_isolation(b"", {})
    verify_embedded.embedding_failure(tmp_path / "model.engine")
    monkeypatch.undo()
    with ServeWorkspace() as workspace:
        commands.append(list(workspace._guard.args))
    assert len(commands) == 3
    isolated, bootstrapped = [sys.executable, "-I", "-c"], [sys.executable, "-c", spawn.BOOTSTRAP]
    for command in commands:
        assert command[:3] in (isolated, bootstrapped), command
    assert spawn.BOOTSTRAP.startswith('import sys\nif sys.path and sys.path[0] == "":\n    del sys.path[0]\n')


def test_an_isolated_run_that_fails_before_it_ran_the_model_is_one_line_not_a_pass(tmp_path, monkeypatch):
    """A child that cannot start (here: the package folder it is told to load is gone) is not a model that ran."""
    monkeypatch.setattr(spawn, "PACKAGE_DIR", tmp_path / "gone")
    model = small_onnx(tmp_path / "model.onnx")
    result = runner.invoke(app, ["fuse", str(model), "-o", str(tmp_path / "out.onnx")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "failed before it ran the model" in lines[0] and "Traceback" not in lines[0], lines[0]
    assert not (tmp_path / "out.onnx").exists()


def test_a_model_error_in_the_isolated_run_is_left_to_the_in_process_run(tmp_path):
    from attnres_export.backends.onnxruntime.isolated_run import crash_in_isolation

    model = onnx.load(str(small_onnx(tmp_path / "model.onnx")))
    assert crash_in_isolation(model.SerializeToString(), {"x": np.ones((2, 3, 4), np.int64)}) is None


def test_an_embedded_plugin_check_that_fails_before_it_read_the_engine_says_so(tmp_path, monkeypatch):
    from attnres_export.backends.tensorrt.verify_embedded import embedding_failure

    monkeypatch.setattr(spawn, "PACKAGE_DIR", tmp_path / "gone")
    failure = embedding_failure(tmp_path / "model.engine")
    assert failure is not None and "failed before it read the engine" in failure and "\n" not in failure


@NEEDS_SERVER
def test_tritonserver_starts_outside_the_working_directory(tmp_path, monkeypatch):
    """The Python-backend stubs Triton starts put their working directory first on sys.path: Triton's must not be
    the user's folder. A script stands in for ``tritonserver`` and records where it ran."""
    from pytriton.server.triton_server import TritonServer
    from pytriton.server.triton_server_config import TritonServerConfig

    from attnres_export.serve.proxy_patches import TRITON_CWD, patch_server_start

    record = tmp_path / "cwd"
    fake = tmp_path / "tritonserver"
    fake.write_text(f"#!/bin/sh\npwd > {record}\n")
    fake.chmod(0o755)
    config = TritonServerConfig()
    config["model-repository"] = str(tmp_path)
    patch_server_start(TritonServer)
    monkeypatch.chdir(plant(tmp_path / "work"))
    server = TritonServer(path=fake, libs_path=tmp_path, config=config, verbose=False)
    server.start()
    server._tritonserver_running_cmd.wait(timeout=60)
    assert record.read_text().strip() == TRITON_CWD


@pytest.mark.slow
@NEEDS_SERVER
def test_attnres_serve_run_from_a_folder_of_planted_modules_runs_none_of_them(tmp_path):
    from attnres_export.serve.backend import loopback_ports
    from tests.serve.server_process import Server, wait_ready

    folder = plant(tmp_path / "work")
    small_onnx(folder / "model.onnx")
    ports = loopback_ports(3)
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen([*cli("attnres", "main"), "serve", "model.onnx", "--model-name", "m",
                                    "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
                                    "--metrics-port", str(ports[2])],
                                   cwd=folder, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    server = Server(process, "m", *(f"127.0.0.1:{p}" for p in ports), log)
    try:
        wait_ready(server, 300)
    finally:
        code, _ = server.stop(signal.SIGTERM)
    assert markers(folder) == []
    assert code == 0, server.output()[-3000:]


def test_build_tools_are_never_taken_from_the_working_directory_through_a_relative_path_entry(tmp_path,
                                                                                                monkeypatch):
    from attnres_export.errors import PluginBuildError
    from attnres_export.plugins import toolchain

    folder = tmp_path / "work"
    folder.mkdir()
    for tool in ("nvcc", "cmake"):
        (folder / tool).write_text(f"#!/bin/sh\ntouch {folder}/ran-{tool}\n")
        (folder / tool).chmod(0o755)
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PATH", os.pathsep.join(["", ".", "bin", str(tmp_path / "empty")]))
    monkeypatch.delenv("CUDACXX", raising=False)
    monkeypatch.setattr(toolchain, "NVCC_FALLBACKS", ())
    with pytest.raises(PluginBuildError, match="nvcc not found"):
        toolchain.find_nvcc()
    with pytest.raises(PluginBuildError, match="cmake not found"):
        toolchain.find_cmake()
