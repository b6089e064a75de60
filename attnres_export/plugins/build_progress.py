"""Progress lines of a native build, read from CMake's and nvcc's output as it streams.

``cmake --build`` prints one line per object and library (make: ``[ 40%] Building CUDA object ...``; ninja:
``[3/12] ...``). One nvcc call compiles a kernel file for every architecture, so its own steps are the only
per-architecture signal: with ``-v`` (``NVCC_APPEND_FLAGS``) nvcc prints each command before running it, and
the device compiler (``cicc``) runs once per architecture with ``--orig_src_file_name`` and ``-arch compute_NN``.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

TARGET_NAMES = {
    "attnres_kernel_objects": "kernels",
    "attnres_kernels": "libattnres_kernels.so",
    "attnres_plugin_objects": "TensorRT plugins",
    "attnres_trt": "libattnres_trt.so",
    "attnres_trt_dyn": "libattnres_trt_dyn.so",
}
"""CMake target (CMakeLists.txt) -> what a progress line calls it."""

_STEP_RE = re.compile(r"^\[\s*(?P<step>\d+%|\d+/\d+)\]\s+(?P<what>Building \w+ object|Linking \w+ shared library)\s+"
                      r"(?P<path>\S+)")
_OBJECT_RE = re.compile(r"CMakeFiles/(?P<target>[^/]+)\.dir/(?P<source>.+)\.o$")
_CICC_RE = re.compile(r'^#\$ .*cicc"?\s.*--orig_src_file_name "(?P<source>[^"]+)".*'
                      r"\s-arch\s+compute_(?P<arch>\d+[a-z]?)")

NVCC_VERBOSE = "-v"
"""What the build appends to ``NVCC_APPEND_FLAGS`` so that nvcc names each architecture as it compiles it."""


def arch_count(cuda_archs: str) -> int:
    """Architectures nvcc compiles for a CMake list such as ``80-real;86-real;89-real;90`` (one cicc run each)."""
    return len({re.match(r"\d+[a-z]?", a).group(0) for a in cuda_archs.split(";") if re.match(r"\d+", a)})


class BuildProgress:
    """Turns build output lines into short progress lines; ``feed`` returns None for lines that say nothing new."""

    def __init__(self, cuda_archs: str) -> None:
        self.archs = arch_count(cuda_archs)
        self._seen: dict[str, int] = {}

    def feed(self, line: str) -> str | None:
        step = _STEP_RE.match(line)
        if step is not None:
            return self._step(step)
        cicc = _CICC_RE.match(line)
        if cicc is not None:
            source = PurePosixPath(cicc.group("source")).name
            self._seen[source] = self._seen.get(source, 0) + 1
            return (f"kernels: {source} for sm_{cicc.group('arch')} "
                    f"(architecture {self._seen[source]} of {self.archs})")
        return None

    @staticmethod
    def _step(step: re.Match[str]) -> str:
        where, path = f"[{step.group('step')}]", step.group("path")
        if step.group("what").startswith("Linking"):
            return f"{where} linking {PurePosixPath(path).name}"
        found = _OBJECT_RE.search(path)
        if found is None:
            return f"{where} compiling {PurePosixPath(path).name}"
        target = TARGET_NAMES.get(found.group("target"), found.group("target"))
        return f"{where} {target}: compiling {PurePosixPath(found.group('source')).name}"
