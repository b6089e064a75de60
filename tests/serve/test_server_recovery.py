"""``attnres serve`` on a real Triton server when things go wrong: readiness comes only with the model (live
comes first), the death of a model instance's process turns readiness off and the backend is replaced, and a
SIGKILL of the command leaves no process, workspace, model copy or shared memory behind. One server."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from attnres_export.serve.backend import STUB, command_line, descendants
from attnres_export.serve.workspace import SHM_DIR, shm_prefix
from tests.serve.conftest import NEEDS_SERVER
from tests.serve.server_process import alive, launch, wait_for
from tests.serve.test_server import _infer

pytestmark = [NEEDS_SERVER, pytest.mark.slow]
START_S = 240  # a loaded two-core machine needed up to three starts of the backend


def stubs(server) -> list[int]:
    return sorted(p for p in descendants(server.process.pid) if command_line(p)[:1] and
                  command_line(p)[0].endswith(STUB))


def test_readiness_restarts_and_sigkill_cleanup(served_onnx, tmp_path):
    from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner

    reference = OnnxRuntimeRunner(served_onnx)
    reference.activate()
    ids = np.array([[3, 1, 4, 1, 5]], dtype=np.int64)
    expected = reference.infer({"input_ids": ids})["logits"]
    server = launch(served_onnx, tmp_path / "serve.log", "--instances", "2")
    try:
        first_live = wait_for(lambda: server.status("/v2/health/live") == 200, START_S)
        assert first_live is not None, server.output()[-3000:]
        # The front listens (live) while the runners load and Triton starts, and says not ready meanwhile.
        assert server.status("/v2/health/ready") == 503 and server.status("/v2/models/m/ready") == 503
        assert wait_for(lambda: server.status("/v2/health/ready") == 200, START_S) is not None, \
            server.output()[-3000:]
        # Ready means the model answers at once.
        np.testing.assert_allclose(_infer("http", server.http, "m", ids), expected, rtol=1e-6, atol=1e-6)

        killed = stubs(server)
        assert len(killed) == 2
        os.kill(killed[1], signal.SIGKILL)
        assert wait_for(lambda: server.status("/v2/health/ready") == 503, 5) is not None
        assert server.status("/v2/models/m/ready") == 503
        back = wait_for(lambda: server.status("/v2/health/ready") == 200, START_S, step_s=0.5)
        assert back is not None, server.output()[-3000:]
        assert "died; restarting the backend" in server.output()
        assert "the backend is serving m again" in server.output()
        np.testing.assert_allclose(_infer("grpc", server.grpc, "m", ids), expected, rtol=1e-6, atol=1e-6)

        started = descendants(server.process.pid)
        folders = [Path(command_line(p)[1]).parents[1] for p in stubs(server)]  # Triton's copies of the model
        workspace = next(Path(command_line(p)[0]).parents[3] for p in started
                         if command_line(p)[:1] and command_line(p)[0].endswith("/bin/tritonserver"))
        assert folders and all(f.is_dir() for f in folders) and workspace.name.startswith("attnres-serve-")
        server.process.kill()
        server.process.wait(timeout=30)

        def regions() -> list[Path]:
            return list(SHM_DIR.glob(f"{shm_prefix(server.process.pid)}*")) if SHM_DIR.is_dir() else []

        def clean() -> bool:
            return (not any(alive(p) for p in started) and not workspace.exists()
                    and not any(f.exists() for f in folders) and not regions())

        clean = wait_for(clean, 60, step_s=0.5)
        assert clean is not None, ([p for p in started if alive(p)], workspace.exists(),
                                   [f for f in folders if f.exists()], regions())
    finally:
        if server.process.poll() is None:
            server.stop(signal.SIGKILL)
        reference.deactivate()
