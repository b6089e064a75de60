"""The pieces of ``attnres serve`` that need no running server: the inference callable's batching, the library
path for PyTriton's stub, the missing extra and bad options as one line."""

from __future__ import annotations

import os
import sys
import sysconfig
import time
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from attnres_export.cli import app
from attnres_export.serve import dependencies, server
from attnres_export.serve.server import infer_function, model_name_for
from attnres_export.serve.signature import Signature, TensorSpec
from tests.serve.conftest import NEEDS_SERVER

runner = CliRunner()


class Doubling:
    """A runner that records the batches it ran."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, ...]] = []

    def infer(self, feeds):
        self.batches.append(feeds["x"].shape)
        return {"y": feeds["x"].astype(np.float64) * 2}


SIGNATURE = Signature((TensorSpec("x", "int64", (-1, -1)),), (TensorSpec("y", "float32", (-1, -1)),), 8)


def request(array) -> SimpleNamespace:
    return SimpleNamespace(data={"x": np.asarray(array, dtype=np.int64)})


def test_requests_of_one_shape_run_as_one_batch_and_are_split_back_in_order():
    doubling = Doubling()
    requests = [request([[1, 2]]), request([[3, 4, 5]]), request([[6, 7], [8, 9]]), request([[10, 11, 12]])]
    responses = infer_function(doubling, SIGNATURE)(requests)
    assert sorted(doubling.batches) == [(2, 3), (3, 2)]
    for req, resp in zip(requests, responses, strict=True):
        assert resp["y"].dtype == np.float32 and np.array_equal(resp["y"], req.data["x"] * 2)


def test_an_unbatched_model_runs_each_request_alone():
    doubling = Doubling()
    unbatched = Signature(SIGNATURE.inputs, SIGNATURE.outputs, 0)
    responses = infer_function(doubling, unbatched)([request([[1]]), request([[2]])])
    assert doubling.batches == [(1, 1), (1, 1)] and [r["y"].tolist() for r in responses] == [[[2.0]], [[4.0]]]


def test_the_interpreters_library_folder_leads_ld_library_path(monkeypatch, tmp_path):
    (tmp_path / f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0").write_text("")
    monkeypatch.setattr(sysconfig, "get_config_var", {"LIBDIR": str(tmp_path), "Py_ENABLE_SHARED": 1}.get)
    env = dependencies.server_environment({"LD_LIBRARY_PATH": f"/other{os.pathsep}{tmp_path}"})
    assert env["LD_LIBRARY_PATH"] == f"{tmp_path}{os.pathsep}/other"
    assert dependencies.server_environment({})["LD_LIBRARY_PATH"] == str(tmp_path)
    monkeypatch.setattr(sysconfig, "get_config_var", {"LIBDIR": str(tmp_path), "Py_ENABLE_SHARED": 0}.get)
    assert "LD_LIBRARY_PATH" not in dependencies.server_environment({})


def test_a_missing_serve_extra_is_one_line_with_the_install_command_that_works(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pytriton.triton", None)
    monkeypatch.setitem(sys.modules, "tritonclient.http", None)
    result = runner.invoke(app, ["serve", str(tmp_path / "m.onnx")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "needs the serve extra" in lines[0] and "attnres-export[serve]" not in lines[0]
    assert f"{sys.executable} -m pip install 'nvidia-pytriton>=0.7'" in lines[0] and "numpy<2" in lines[0]


def test_the_install_command_installs_exactly_the_serve_extra():
    from pathlib import Path

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert list(dependencies.SERVE_REQUIREMENTS) == pyproject["project"]["optional-dependencies"]["serve"]


def test_model_names_default_to_the_stem_and_are_checked():
    from pathlib import Path

    from attnres_export.serve.dependencies import ServeError

    assert model_name_for(Path("a/tiny.tensorrt.onnx"), None) == "tiny.tensorrt"
    assert model_name_for(Path("m.engine"), None) == "m" and model_name_for(Path("m.plan"), None) == "m"
    with pytest.raises(ServeError, match="letters, digits"):
        model_name_for(Path("m.onnx"), "a b")


@NEEDS_SERVER
@pytest.mark.parametrize(("args", "pattern"), [
    (["--instances", "0"], "--instances 0: must be at least 1"),
    (["--instances", "100000"], f"--instances 100000 is over this machine's {server.usable_cores()} usable CPU cores"),
    (["--max-batch", "17"], "--max-batch 17 is over the batch range"),
    (["--http-port", "9000", "--grpc-port", "9000"], "ports must differ"),
    (["--http-port", "70000"], "--http-port 70000"),
])
def test_bad_serve_options_are_one_line_and_start_nothing(portable_onnx, args, pattern):
    from attnres_export.serve.backend import loopback_ports

    ports = dict(zip(("--http-port", "--grpc-port", "--metrics-port"), map(str, loopback_ports(3)), strict=True))
    defaults = [item for option, port in ports.items() if option not in args for item in (option, port)]
    started = time.monotonic()
    result = runner.invoke(app, ["serve", str(portable_onnx), *defaults, *args])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and pattern in lines[0], result.output
    assert time.monotonic() - started < 30


def test_instances_are_bounded_by_memory_as_well(monkeypatch):
    monkeypatch.setattr(server, "usable_cores", lambda: 64)
    monkeypatch.setattr(server, "available_memory", lambda: 1024 * 2**20)
    server.check_instances(5, 64 * 2**20)
    with pytest.raises(dependencies.ServeError, match=r"--instances 6 needs about 1152 MB \(192 MB each: .*\); "
                                                      r"1024 MB is available, enough for 5"):
        server.check_instances(6, 64 * 2**20)


@NEEDS_SERVER
def test_a_port_in_use_is_one_line_before_anything_starts(portable_onnx):
    import socket

    from attnres_export.serve.backend import loopback_ports

    http_port, metrics_port = loopback_ports(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["serve", str(portable_onnx), "--grpc-port", str(port), "--http-port",
                                     str(http_port), "--metrics-port", str(metrics_port)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert f"--grpc-port {port}: cannot listen on 127.0.0.1:{port}" in lines[0]


def test_an_engine_is_served_through_one_tensorrt_runner_per_instance(fake_engine, monkeypatch):
    """The fake deserializes but cannot execute: this covers loading, the signature and the instances only."""
    from attnres_export.backends.tensorrt.runner import TensorRTRunner
    from attnres_export.serve.server import ServeOptions, load_model

    monkeypatch.setattr(TensorRTRunner, "activate", TensorRTRunner.load)  # no CUDA stream without a GPU
    monkeypatch.setattr(server, "usable_cores", lambda: 8)  # three instances on a machine of any size
    served = load_model(ServeOptions(fake_engine, instances=3, max_batch=2))
    assert served.name == "m" and served.backend == "TensorRT" and len(served.runners) == 3
    assert len({id(r) for r in served.runners}) == 3 and all(r.engine is not None for r in served.runners)
    assert [(s.name, s.dtype, s.dims) for s in served.signature.inputs] == [("input_ids", "int64", (-1, -1))]
    assert [(s.name, s.dtype, s.dims) for s in served.signature.outputs] == [("logits", "float32", (-1, -1, 4))]
    assert served.signature.max_batch == 2
    batch = served.limits.profiles[0]["input_ids"][0]
    assert (batch.low, batch.high) == (1, 2) and served.limits.inputs["input_ids"].values.high == 4


def test_triton_repo_without_tritonclient_is_one_line_naming_the_extra(monkeypatch, tmp_path):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(dependencies, "_MODEL_CONFIG", {})
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tritonclient" else real_find_spec(name, *a))
    from tests.serve.models import tiny_onnx

    model = tiny_onnx(tmp_path / "m.onnx")
    result = runner.invoke(app, ["triton-repo", str(model), "-o", str(tmp_path / "repo")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert f"{sys.executable} -m pip install 'nvidia-pytriton>=0.7'" in lines[0]
    assert not (tmp_path / "repo" / "m").exists()


@NEEDS_SERVER
def test_the_proxy_files_triton_loads_wait_60_s_for_the_first_instances_handshake():
    from pytriton.models.model import Model
    from pytriton.proxy.data import TensorStore

    from attnres_export.serve.proxy_patches import ONE_SECOND, PATIENT, patch_proxy

    patch_proxy(Model, TensorStore)
    patch_proxy(Model, TensorStore)  # once only
    model = SimpleNamespace(model_version=1, SCRIPT_FILES_TO_COPY=Model.SCRIPT_FILES_TO_COPY)
    files = Model.get_proxy_model_files(model)
    assert PATIENT in files["file:1/communication.py"] and ONE_SECOND not in files["file:1/communication.py"]
    original = Model.get_proxy_model_files.__wrapped__(model)
    assert ONE_SECOND in original["file:1/communication.py"]
    assert {k: v for k, v in files.items() if not k.endswith(("communication.py", "data.py"))} == {
        k: v for k, v in original.items() if not k.endswith(("communication.py", "data.py"))}


@NEEDS_SERVER
def test_the_tensor_store_copies_a_zero_size_tensor_on_both_sides_of_triton():
    """The empty past of a with-past graph's first step: PyTriton's ``memoryview.cast`` refuses it unpatched."""
    from pytriton.models.model import Model
    from pytriton.proxy.data import (
        TensorStore,
        deserialize_numpy_with_struct_header,
        serialize_numpy_with_struct_header,
    )

    from attnres_export.serve.proxy_patches import EMPTY_FRAME_CAST, ZERO_SIZE_CAST, patch_proxy

    patch_proxy(Model, TensorStore)
    empty = np.zeros((2, 4, 0, 8), dtype=np.float16)
    shm = SimpleNamespace(buf=memoryview(bytearray(256)))
    with pytest.raises(TypeError, match="zeros in shape"):
        TensorStore._copy_frames.__wrapped__(None, serialize_numpy_with_struct_header(empty), shm, 0)
    written = TensorStore._copy_frames(None, serialize_numpy_with_struct_header(empty), shm, 0)
    frames = TensorStore._handle_frames(None, shm, 0)
    assert written > 0 and deserialize_numpy_with_struct_header(frames).shape == empty.shape
    model = SimpleNamespace(model_version=1, SCRIPT_FILES_TO_COPY=Model.SCRIPT_FILES_TO_COPY)
    stub_side = Model.get_proxy_model_files(model)["file:1/data.py"]
    assert EMPTY_FRAME_CAST in stub_side and ZERO_SIZE_CAST not in stub_side


def test_a_process_that_exits_while_its_children_are_listed_has_none(monkeypatch):
    """/proc/<pid>/task vanishing mid-listing raises ProcessLookupError from the glob itself (seen in CI)."""
    from pathlib import Path

    from attnres_export.serve import backend

    def vanished(self, pattern):
        raise ProcessLookupError(3, "No such process", str(self))

    assert backend.children(os.getpid()) is not None
    monkeypatch.setattr(Path, "glob", vanished)
    assert backend.children(os.getpid()) == set()
    assert backend.descendants(os.getpid()) == set()


@pytest.mark.parametrize("signum", ["SIGSTOP", "SIGKILL"], ids=["hung", "killed"])
def test_a_hung_or_dead_backend_is_stopped_through_pytriton_only_after_pytriton_has_seen_its_server_exit(
        tmp_path, signum):
    """PyTriton (through ``sh``) counts its server alive until its reaper thread has noted the exit; a stop in that
    window signals a pid that may be reaped already, and its ProcessLookupError ended ``attnres serve`` (seen in CI
    after a SIGSTOP). The fake notes the exit 0.3 s after the reap, as a busy reaper thread may."""
    import signal
    import subprocess
    import threading

    from attnres_export.serve import backend

    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    group = backend.Process.of(server.pid, "tritonserver")
    os.kill(server.pid, getattr(signal, signum))
    while signum == "SIGKILL" and group.alive():  # stop follows ``dead``, which saw the server die
        time.sleep(0.01)

    class PyTritonSeenFromOutside:
        def __init__(self) -> None:
            self.exit_noted = threading.Event()
            self.stopped_while_counted_alive: bool | None = None
            threading.Thread(target=self._reap, daemon=True).start()

        def _reap(self) -> None:
            server.wait()
            time.sleep(0.3)
            self.exit_noted.set()

        def is_alive(self) -> bool:
            return not self.exit_noted.is_set()

        def stop(self) -> None:
            self.stopped_while_counted_alive = self.is_alive()

    stopped = backend.TritonBackend("m", None, [], tmp_path, exit_timeout_s=1, max_queue_delay_us=0)
    stopped.triton = PyTritonSeenFromOutside()
    stopped.group = group
    stopped.watched = [group]
    stopped.hung = signum == "SIGSTOP"
    stopped.stop()
    assert server.poll() == -signal.SIGKILL
    assert stopped.triton.stopped_while_counted_alive is False
