"""Triton's own output as ``attnres serve`` passes it on: cut into lines, with the lines known to be harmless
taken out, and held while a backend starts so that the line saying where the model is served comes first.

Triton prints E- and W-level lines at every start on a machine without a usable GPU (below): a user who sees
``E... CudaDriverHelper has not been initialized.`` thinks serving failed. Those lines (HARMLESS) go to this
module's logger at debug level instead, and are shown as well only with ``ServeOptions.show_harmless_log``; every
other line of Triton's, E and W included, is shown as it was. PyTriton reads Triton's output unbuffered, so it
comes in chunks that need not end at a line's end: ``TritonLog`` joins them into lines.

A backend's start-up output (its option tables, model loading) is held until the server announces that it serves
(``release`` after the announcement), then passed on in order; a start that fails releases it before its error is
reported (the errors say "see its log above"). Output after that (requests that failed in Triton, shutdown) is
passed on as it comes.

gRPC's own informational line ``fork_posix.cc:71] Other threads are currently calling into gRPC, skipping fork()
handlers`` is printed by this process (the front's gRPC server runs when PyTriton forks to start Triton), not by
Triton: ``quiet_grpc`` keeps gRPC's log at errors, which must be set before ``grpc`` is imported.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

LOGGER = logging.getLogger(__name__)

LINE = re.compile(r"^(?P<level>[IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ (?P<source>[\w.-]+):\d+\] ?(?P<message>.*)$")
"""A line of Triton's log: level, date, time, thread, ``source.cc:LINE]``, the message (quoted since Triton 2.4x)."""


@dataclass(frozen=True)
class Harmless:
    """A line Triton prints that says nothing wrong with ``attnres serve``: its level, the source file that prints
    it, and a pattern its message (without Triton's quotes) starts with."""

    level: str
    source: str
    message: str
    why: str
    seen: str


HARMLESS: tuple[Harmless, ...] = (
    Harmless(
        "E", "server.cc", r"CudaDriverHelper has not been initialized\.",
        why="Triton loads the CUDA driver at start for its own GPU memory (CUDA virtual-memory allocations) and "
            "reports it missing on a machine without one; the model's runners (ONNX Runtime, TensorRT) run in "
            "the Python-backend stubs with CUDA of their own, and Triton's GPU memory is never used",
        seen="every start on a machine without a GPU (Triton 2.51.0 in nvidia-pytriton 0.7.0, 2 cores, no "
             "NVIDIA driver), right after the two lines below"),
    Harmless(
        "W", "pinned_memory_manager.cc", r"Unable to allocate pinned system memory, pinned memory pool will not "
                                         r"be available",
        why="the pinned pool speeds copies between Triton's host and GPU buffers; the Python backend that runs our "
            "model hands tensors to the stubs through shared memory on the host, so it needs none",
        seen="every start on a machine without a GPU, ending ': CUDA driver version is insufficient for CUDA "
             "runtime version' (Triton 2.51.0)"),
    Harmless(
        "I", "cuda_memory_manager.cc", r"CUDA memory pool disabled",
        why="the same: Triton's own GPU buffers, which the Python backend does not use",
        seen="every start on a machine without a GPU, right after the pinned-memory warning (Triton 2.51.0)"),
    Harmless(
        "E", "model_repository_manager.cc", r"Failed to set config modification time: model_config_content_name_ "
                                            r"is empty",
        why="PyTriton loads the model with its config sent in the load request, not read from a config.pbtxt, so "
            "Triton has no file whose time to record; that time only decides whether a later load re-reads the "
            "config file, and the model is loaded once (Triton core keeps the failed time as 0 by design, "
            "triton-inference-server/core pull request 388)",
        seen="every start, GPU or not, just before 'loading: NAME:1' (Triton 2.51.0)"),
)
"""Triton's lines known to be harmless for ``attnres serve``; each stays in this module's debug log."""


def harmless(line: str) -> Harmless | None:
    """The entry of HARMLESS that ``line`` (one line of Triton's log) matches, if any."""
    parsed = LINE.match(line.rstrip("\r\n"))
    if parsed is None:
        return None
    message = parsed["message"].removeprefix('"')
    for entry in HARMLESS:
        if parsed["level"] == entry.level and parsed["source"] == entry.source and re.match(entry.message, message):
            return entry
    return None


def write_stdout(line: str) -> None:
    """Where Triton's lines went before (PyTriton printed them): this process's standard output."""
    sys.stdout.write(line)
    sys.stdout.flush()


class TritonLog:
    """Triton's output (``feed``, from PyTriton's reader thread: bytes or text, in chunks) as lines: harmless ones
    (HARMLESS) to the debug log, and to ``show`` too when ``show_harmless``; the others to ``show``. Lines are held
    from ``hold`` until ``release`` (a log starts released); ``close`` also passes on a last unfinished line."""

    def __init__(self, show: Callable[[str], None] = write_stdout, show_harmless: bool = False) -> None:
        self.show = show
        self.show_harmless = show_harmless
        self._lock = threading.Lock()
        self._partial = ""
        self._held: list[str] | None = None

    def feed(self, chunk: bytes | str) -> None:
        text = chunk.decode("utf-8", errors="replace") if isinstance(chunk, bytes) else chunk
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
            for line in lines:
                self._pass(line + "\n")

    def hold(self) -> None:
        with self._lock:
            if self._held is None:
                self._held = []

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held or [], None
            for line in held:
                self._route(line)

    def close(self) -> None:
        self.release()
        with self._lock:
            partial, self._partial = self._partial, ""
            if partial:
                self._route(partial + "\n")

    @property
    def holding(self) -> bool:
        return self._held is not None

    def _pass(self, line: str) -> None:
        if self._held is not None:
            self._held.append(line)
        else:
            self._route(line)

    def _route(self, line: str) -> None:
        entry = harmless(line)
        if entry is not None:
            LOGGER.debug("Triton, known harmless (triton_log.HARMLESS): %s", line.rstrip("\n"))
            if not self.show_harmless:
                return
        self.show(line)


def quiet_grpc() -> None:
    """gRPC's log at errors only, unless the user chose its level (GRPC_VERBOSITY): read when ``grpc`` is first
    imported, so this runs before."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
