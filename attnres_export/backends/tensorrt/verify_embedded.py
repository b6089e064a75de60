"""Is the plugin really inside an engine? Deserialize it in a fresh process that loads no plugin library.

The build process has the library loaded, so only another process shows whether ``--embed-plugin`` worked:
TensorRT serializes plugin libraries only into version-compatible engines, and an engine that merely looks
embedded would fail on the first machine without the library. Started through ``attnres_export.spawn`` (nothing
of the user's folder is importable) with ``main([ENGINE])``: exit 0, it deserializes; NOT_EMBEDDED, one line on
stderr says why not; anything else, the check never got to the engine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from attnres_export.backends.tensorrt.api import logger, require_tensorrt
from attnres_export.errors import EngineError
from attnres_export.spawn import python_main

TIMEOUT_S = 600
NOT_EMBEDDED = 3
"""The child's exit status when the engine does not deserialize there (Python's own status for an uncaught
exception, a failed import say, is 1)."""


def embedding_failure(engine: Path) -> str | None:
    """None when a fresh process deserializes ``engine`` with no plugin library loaded, else why it could not."""
    command = python_main("attnres_export.backends.tensorrt.verify_embedded", str(engine))
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"the check in a fresh process took over {TIMEOUT_S} s"
    if proc.returncode == 0:
        return None
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else "no output"
    if proc.returncode == NOT_EMBEDDED:
        return last
    return f"the check in a fresh process failed before it read the engine (exit {proc.returncode}: {last})"


def deserializes_without_library(engine: Path) -> str | None:
    """In this process (which must have loaded no plugin library): None if ``engine`` deserializes, else why not."""
    try:
        trt = require_tensorrt()
        data = Path(engine).read_bytes()
    except (EngineError, OSError) as exc:
        return str(exc)
    runtime = trt.Runtime(logger(trt))
    runtime.engine_host_code_allowed = True
    if runtime.deserialize_cuda_engine(data) is None:
        return (f"TensorRT {trt.__version__} could not deserialize it in a fresh process that loads no plugin "
                "library, with engine host code allowed")
    return None


def main(argv: list[str]) -> int:
    (engine,) = argv
    failure = deserializes_without_library(Path(engine))
    if failure is not None:
        print(failure, file=sys.stderr)
        return NOT_EMBEDDED
    return 0
