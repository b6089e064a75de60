"""Running an untrusted ONNX model once in a separate process, so that a crash of ONNX Runtime itself (a
segfault or ``terminate called ...`` on a malformed graph) is reported in one line instead of ending ours.

Used before a foreign model (an ONNX file or a graph exported from someone's program) is run in-process.
This module imports only NumPy and ONNX Runtime so that the extra process starts in a fraction of a second. It is
started through ``attnres_export.spawn`` (nothing of the user's folder is importable) with ``main([MODEL.onnx,
FEEDS.npz])``: exit 0, it ran; MODEL_ERROR, ONNX Runtime raised on the model; anything else, it never got that far.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from attnres_export.errors import ParityError
from attnres_export.spawn import python_main

TIMEOUT_S = 600
MODEL_ERROR = 3
"""The child's exit status when ONNX Runtime raised a Python-level error on the model (Python's own status for an
uncaught exception, a failed import say, is 1)."""


def crash_in_isolation(model_bytes: bytes, feeds: dict[str, np.ndarray]) -> str | None:
    """None when ONNX Runtime CPU runs the model on ``feeds`` in a fresh process, else why it did not.

    Only a crash (a signal, or an abort) counts: ONNX Runtime raising on the model is left to the in-process run,
    which reports it as usual. A child that fails before it runs the model is a ParityError: nothing was checked."""
    with tempfile.TemporaryDirectory(prefix="attnres-isolated-") as tmp:
        model_path, feeds_path = Path(tmp) / "model.onnx", Path(tmp) / "feeds.npz"
        model_path.write_bytes(model_bytes)
        np.savez(feeds_path, **feeds)
        command = python_main("attnres_export.backends.onnxruntime.isolated_run", str(model_path), str(feeds_path))
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return f"ONNX Runtime did not finish one run in {TIMEOUT_S} s"
    if proc.returncode < 0:
        return f"ONNX Runtime crashed running it ({signal.Signals(-proc.returncode).name})"
    if "terminate called" in proc.stderr:
        return "ONNX Runtime aborted running it (terminate called after an exception in C++)"
    if proc.returncode not in (0, MODEL_ERROR):
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        raise ParityError(f"the separate process that runs the model once first failed before it ran the model "
                          f"(exit {proc.returncode}: {lines[-1] if lines else 'no output'}); check that NumPy and "
                          f"ONNX Runtime import in {sys.executable}")
    return None


def main(argv: list[str]) -> int:
    import onnxruntime as ort

    model_path, feeds_path = argv
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
        with np.load(feeds_path) as feeds:
            session.run(None, {name: feeds[name] for name in feeds.files})
    except Exception as exc:  # a Python-level error is not a crash: the caller's own run reports it
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return MODEL_ERROR
    return 0
