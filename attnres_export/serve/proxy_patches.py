"""Fixes to PyTriton: two to the proxy it runs on both sides of Triton's Python backend, in the files it sends
Triton (``Model.get_proxy_model_files``) and in its tensor store in this process (``TensorStore``); two to how it
starts ``tritonserver`` (``TritonServer.start``): where, and where its output goes.

- **A longer handshake wait.** PyTriton's Python-backend proxy (0.7.0, and the releases before it) has every model
  instance after the first wait 1 s for the first instance's handshake socket (``get_config_from_handshake_server``,
  ``timeout_s=1.0``); the first instance makes that socket only after it has spawned its tensor-store process, a
  fresh Python interpreter. On a loaded machine that takes longer, and the model fails to load: measured, five
  starts of ``attnres serve --instances 2`` failed in a row at load average 10 on two cores. The copies Triton
  loads get a 60 s wait instead.
- **Zero-size tensors.** The tensor store copies each tensor into shared memory through ``memoryview.cast("B")``,
  which raises "cannot cast view with zeros in shape or strides" for a tensor with a zero dim: the empty past of
  a with-past graph's first step (prefill), so no generation could start through ``attnres serve``. An empty
  frame is copied as ``b""`` instead (nothing to copy; the header keeps its shape).
- **Not in the user's folder.** ``tritonserver`` inherited the working directory of ``attnres serve``, and with it
  every Python-backend stub and tensor store it starts, whose interpreters put it first on sys.path: measured with
  PyTriton 0.7.0, the stubs imported ``json``, ``multiprocessing`` and ``triton_python_backend_utils``, and the
  tensor store ``json`` and ``numpy``, from the folder the command was run from. It starts in TRITON_CWD instead.
- **Its output to us.** PyTriton printed every chunk of Triton's output itself; a server started inside
  ``triton_output(sink)`` sends it to ``sink`` instead (triton_log.py: harmless lines out, start-up held).

The proxy's texts are matched exactly, so a PyTriton whose proxy reads differently is left alone (the supervisor's start
retries remain; a zero-size request then fails as before).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from functools import wraps

FILE_PATCHES: dict[str, tuple[tuple[bytes, bytes], ...]] = {
    "communication.py": ((
        b"def get_config_from_handshake_server(socket_path: pathlib.Path, timeout_s: float = 1.0) -> dict:",
        b"def get_config_from_handshake_server(socket_path: pathlib.Path, timeout_s: float = 60.0) -> dict:"),),
    "data.py": ((
        b'shm.buf[offset + total_size : offset + total_size + frame.nbytes] = frame.cast("B")\n',
        b'shm.buf[offset + total_size : offset + total_size + frame.nbytes] = frame.cast("B") if frame.nbytes '
        b'else b""\n'),),
}
"""Per proxy file, the exact texts replaced and their replacements."""
ONE_SECOND, PATIENT = FILE_PATCHES["communication.py"][0]
ZERO_SIZE_CAST, EMPTY_FRAME_CAST = FILE_PATCHES["data.py"][0]
TRITON_CWD = "/"
"""The working directory of ``tritonserver`` and all it starts: no Python module there, and only root writes it."""
_output = threading.local()
"""``sink``: where the output of a server started on this thread goes (PyTriton's reader calls it with each chunk)."""


@contextlib.contextmanager
def triton_output(sink: Callable[[bytes | str], None] | None):
    """A ``tritonserver`` this thread starts meanwhile sends its output to ``sink`` (``None``: PyTriton prints it)."""
    _output.sink = sink
    try:
        yield
    finally:
        _output.sink = None


def patched_files(files: dict[str, bytes]) -> dict[str, bytes]:
    """``files`` (PyTriton's ``{"file:VERSION/NAME": content}``) with every patch of ``FILE_PATCHES`` applied."""
    patched = {}
    for key, content in files.items():
        for old, new in FILE_PATCHES.get(key.rsplit("/", 1)[-1], ()):
            content = content.replace(old, new)
        patched[key] = content
    return patched


def _once(owner: type, name: str, wrap: Callable[[Callable], Callable]) -> None:
    original = getattr(owner, name)
    if getattr(original, "attnres_patched", False):
        return
    patched = wraps(original)(wrap(original))
    patched.attnres_patched = True
    setattr(owner, name, patched)


def patch_proxy(model_class: type, tensor_store_class: type) -> None:
    """Patch PyTriton's ``Model`` (the files Triton loads) and ``TensorStore`` (this process's side), once."""
    _once(model_class, "get_proxy_model_files",
          lambda original: lambda self: patched_files(original(self)))
    _once(tensor_store_class, "_copy_frames",
          lambda original: lambda self, frames, shm, offset: original(
              self, [frame if memoryview(frame).nbytes else b"" for frame in frames], shm, offset))


def _started_in(folder: str) -> Callable[[Callable], Callable]:
    """``TritonServer.start`` with ``folder`` as the working directory of the process it starts: PyTriton starts
    ``tritonserver`` through ``sh``, whose commands take it from ``sh.Command``'s defaults when not given; and its
    output to this thread's ``triton_output`` sink (PyTriton hands ``sh`` its ``_record_logs`` as the reader)."""
    def wrap(original: Callable) -> Callable:
        def start(self) -> None:
            import sh

            sink = getattr(_output, "sink", None)
            if sink is not None:
                self._record_logs = sink

            defaults = sh.Command._call_args
            saved, defaults["cwd"] = defaults["cwd"], folder
            try:
                original(self)
            finally:
                defaults["cwd"] = saved
        return start
    return wrap


def patch_server_start(server_class: type) -> None:
    """Patch PyTriton's ``TritonServer`` to start ``tritonserver`` in TRITON_CWD (its output to ``triton_output``),
    once."""
    _once(server_class, "start", _started_in(TRITON_CWD))
