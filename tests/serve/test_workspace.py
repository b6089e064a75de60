"""The serving workspace outlives no server: its guard removes the folder, the leftovers it was told of and the
server's shared-memory regions once the server is gone, a SIGKILL included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from attnres_export.serve.workspace import SHM_DIR, ServeWorkspace, shm_prefix

HOLD = """
import sys, time
from pathlib import Path
from attnres_export.serve.workspace import SHM_DIR, ServeWorkspace, shm_prefix
workspace = ServeWorkspace()
(workspace.root / "triton-0").mkdir()
(workspace.root / "triton-0" / "model.sock").write_text("x")
workspace.leftover(Path(sys.argv[1]))
if SHM_DIR.is_dir():
    (SHM_DIR / f"{shm_prefix(__import__('os').getpid())}test").write_bytes(b"0")
print(workspace.root, flush=True)
time.sleep(120)
"""


def gone(*paths: Path, timeout_s: float = 40) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(p.exists() for p in paths) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(p.exists() for p in paths)


def test_a_killed_server_leaves_no_workspace_leftover_or_shared_memory(tmp_path):
    leftover = tmp_path / "folderABC123"
    (leftover / "1").mkdir(parents=True)
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(leftover)], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        root = Path(process.stdout.readline().strip())
        assert root.is_dir() and root.name.startswith("attnres-serve-")
        region = SHM_DIR / f"{shm_prefix(process.pid)}test"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        assert gone(root, leftover, region), [p for p in (root, leftover, region) if p.exists()]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def test_closing_removes_everything_and_ends_the_guard(tmp_path):
    leftover = tmp_path / "folderXYZ"
    leftover.mkdir()
    workspace = ServeWorkspace()
    workspace.leftover(leftover)
    (workspace.root / "file").write_text("x")
    workspace.close()
    assert not workspace.root.exists() and not leftover.exists() and workspace._guard.poll() is not None


def test_the_workspace_leaves_room_for_pytritons_socket_paths(monkeypatch, tmp_path):
    import tempfile

    import pytest

    from attnres_export.serve.dependencies import ServeError
    from attnres_export.serve.workspace import UNIX_PATH_MAX, socket_names, workspace_parent

    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert workspace_parent("m", 2) == "/tmp"  # TMPDIR would make the sockets' paths too long
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    with ServeWorkspace("tiny.tensorrt", 16) as workspace:
        longest = max(len(str(workspace.generation(999) / n)) for n in socket_names("tiny.tensorrt", 16))
        assert longest <= UNIX_PATH_MAX
    with pytest.raises(ServeError, match=r"model name 'xxxx.*' is too long for PyTriton's Unix socket paths; use "
                                         r"--model-name with at most \d+ characters"):
        workspace_parent("x" * 80, 1)
