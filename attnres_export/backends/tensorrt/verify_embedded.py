"""Is the plugin really inside an engine? Deserialize it in a fresh process that loads no plugin library.

The build process has the library loaded, so only another process shows whether ``--embed-plugin`` worked:
TensorRT serializes plugin libraries only into version-compatible engines, and an engine that merely looks
embedded would fail on the first machine without the library. Run as
``python -m attnres_export.backends.tensorrt.verify_embedded ENGINE`` (exit 0: it deserializes; 1: one line on
stderr says why).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from attnres_export.backends.tensorrt.api import logger, require_tensorrt
from attnres_export.errors import EngineError

TIMEOUT_S = 600


def embedding_failure(engine: Path) -> str | None:
    """None when a fresh process deserializes ``engine`` with no plugin library loaded, else why it could not."""
    command = [sys.executable, "-m", "attnres_export.backends.tensorrt.verify_embedded", str(engine)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"the check in a fresh process took over {TIMEOUT_S} s"
    if proc.returncode == 0:
        return None
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"the check in a fresh process exited with status {proc.returncode}"


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
    if len(argv) != 1:
        print("usage: python -m attnres_export.backends.tensorrt.verify_embedded ENGINE", file=sys.stderr)
        return 2
    failure = deserializes_without_library(Path(argv[0]))
    if failure is not None:
        print(failure, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
