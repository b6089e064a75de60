"""The folder ``attnres serve`` gives PyTriton (the copied ``tritonserver``, the model store, the sockets), and a
guard process that removes it, and what Triton leaves outside it, once the server has exited, however it exited.

A SIGKILL of ``attnres serve`` runs none of its cleanup; ``tritonserver`` then stops by itself (PyTriton starts
it with a parent-death signal) but leaves the workspace (22 MB), the ``/tmp/folderXXXXXX`` copies of the model
files Triton makes when a model is loaded through its API (at a fixed path, whatever TMPDIR says), and, for a
Python-backend stub that was killed, its shared-memory region ``/dev/shm/pytrtion<pid>-...`` (PyTriton's prefix,
spelled so). The guard holds the read end of a pipe whose write end only the server has: end of file means the
server is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from attnres_export.serve.dependencies import ServeError
from attnres_export.spawn import python_code

SHM_DIR = Path("/dev/shm")
UNIX_PATH_MAX = 107
"""The longest path a Unix socket can bind (108 bytes with the terminating NUL)."""
ROOT_PATTERN = "attnres-serve-XXXXXXXX/triton-999/"
"""The workspace's own part of a socket path (``tempfile.mkdtemp`` adds 8 characters; at most 999 starts)."""


def socket_names(model: str, instances: int) -> list[str]:
    """The sockets PyTriton makes in a workspace for ``model``: the handshake, the tensor store, one per instance."""
    return [f"{model}-config.sock", f"{model}-data.sock", f"{model}_0_{instances - 1}-server.sock"]


def workspace_parent(model: str, instances: int) -> str:
    """The temporary folder (TMPDIR, else /tmp) where the sockets' paths fit a Unix socket address."""
    longest = max(len(n) for n in socket_names(model, instances))
    for parent in dict.fromkeys((tempfile.gettempdir(), "/tmp")):
        if len(parent) + 1 + len(ROOT_PATTERN) + longest <= UNIX_PATH_MAX:
            return parent
    room = UNIX_PATH_MAX - len("/tmp/" + ROOT_PATTERN) - (longest - len(model))
    raise ServeError(f"model name {model!r} is too long for PyTriton's Unix socket paths; use --model-name with at "
                     f"most {room} characters")


def shm_prefix(pid: int) -> str:
    """The prefix PyTriton's Python-backend shared-memory regions take in a server process of ``pid``."""
    return f"pytrtion{pid}-"


GUARD = r"""
import os, shutil, signal, sys, time
from pathlib import Path
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
root, prefix = sys.argv[1], sys.argv[2]
paths = [root] + [line.rstrip("\n") for line in sys.stdin]

def running_inside():
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().split(b"\0")[0].decode().startswith(root):
                return True
        except (OSError, UnicodeDecodeError):
            continue
    return False

deadline = time.monotonic() + 30
while running_inside() and time.monotonic() < deadline:
    time.sleep(0.2)
for path in paths:
    shutil.rmtree(path, ignore_errors=True)
for name in os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []:
    if name.startswith(prefix):
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except OSError:
            pass
"""


class ServeWorkspace:
    """``root`` (a new temporary folder, short enough for the sockets PyTriton makes in it for ``model``) and the
    guard that removes it; ``leftover`` names further paths to remove; ``close`` removes everything now."""

    def __init__(self, model: str = "m", instances: int = 1) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="attnres-serve-", dir=workspace_parent(model, instances)))
        self.prefix = shm_prefix(os.getpid())
        self._leftovers: list[Path] = []
        read, write = os.pipe()
        try:
            self._guard = subprocess.Popen(python_code(GUARD, str(self.root), self.prefix),
                                           stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True)
        except OSError:
            os.close(write)
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        finally:
            os.close(read)
        self._pipe = os.fdopen(write, "w", buffering=1)

    def generation(self, number: int) -> Path:
        """The (not yet existing) workspace of the ``number``-th Triton server of this run."""
        return self.root / f"triton-{number}"

    def leftover(self, path: Path) -> None:
        """Remove ``path`` too (now in ``remove_leftovers``, or by the guard if the server dies first)."""
        if path not in self._leftovers:
            self._leftovers.append(path)
            with contextlib.suppress(OSError):
                self._pipe.write(f"{path}\n")

    def remove_leftovers(self) -> None:
        """What a stopped Triton server left: the paths named so far and this process's shared-memory regions
        (call only while no Triton server of this process runs)."""
        for path in self._leftovers:
            shutil.rmtree(path, ignore_errors=True)
        if SHM_DIR.is_dir():
            for region in SHM_DIR.glob(f"{self.prefix}*"):
                region.unlink(missing_ok=True)

    def close(self) -> None:
        self.remove_leftovers()
        shutil.rmtree(self.root, ignore_errors=True)
        with contextlib.suppress(OSError):
            self._pipe.close()
        try:
            self._guard.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._guard.kill()
            self._guard.wait(timeout=10)

    def __enter__(self) -> ServeWorkspace:
        return self

    def __exit__(self, *_) -> None:
        self.close()
