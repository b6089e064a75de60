"""The tools and inputs of the native build, found and checked before CMake runs: cmake, nvcc and the
architectures it compiles, the TensorRT headers and libnvinfer.

Each problem is one line naming the fix (PluginBuildError), so that a bad option fails in a second rather than
after a compile.
"""

from __future__ import annotations

import importlib.util
import os
import pkgutil
import re
import shutil
import subprocess
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from attnres_export.errors import PluginBuildError

DEFAULT_CUDA_ARCHS = "80-real;86-real;89-real;90"
"""80-real;86-real;89-real;90 = A100/A10/L4/H100 SASS plus PTX of 90 (newer GPUs JIT-compile the PTX)."""

MIN_CUDA_ARCH = 80
"""The kernels use cp.async (and bf16 mma), which need sm_80: T4 (75), Xavier (72) and older are unsupported."""

ORIN_ARCH = "87-real"
"""Jetson Orin (AGX, NX, Nano): SASS only, nothing newer JIT-compiles PTX of 87."""

THOR_ARCHS = (110, 101)
"""Jetson Thor: sm_110 from CUDA 13, sm_101 in CUDA 12.8-12.9 (the same GPU, renumbered)."""

ARCH_PRESETS = ("default", "edge")
"""Keywords --cuda-arch accepts besides numbers: default = DEFAULT_CUDA_ARCHS; edge = Jetson Orin (87) and
Thor (110 with CUDA 13, 101 with CUDA 12.8-12.9, left out by older nvcc)."""

NVCC_FALLBACKS = ("/usr/local/cuda/bin/nvcc",)
"""Where nvcc usually lives when it is not on PATH."""


_PIP_LIBS_RE = re.compile(r"tensorrt(_cu\d+)?_libs")
"""pip's folders of TensorRT's shared libraries: tensorrt_libs, tensorrt_cu12_libs, tensorrt_cu13_libs, ..."""



def major_of(version: str | None) -> int | None:
    """10 of "10.3.0"; None when there is no leading number."""
    match = re.match(r"\s*(\d+)", version or "")
    return int(match.group(1)) if match else None


def _edge_archs(nvcc_archs: Collection[int] | None) -> list[str]:
    """Jetson Orin, plus Thor under the number this nvcc knows it by (110 when nvcc was not asked)."""
    archs = [ORIN_ARCH]
    thor = next((a for a in THOR_ARCHS if nvcc_archs is None or a in nvcc_archs), None)
    if thor is not None:
        archs.append(str(thor))
    return archs


def normalize_archs(cuda_archs: str | Sequence[str] | None, nvcc_archs: Collection[int] | None = None) -> str:
    """Accept "80,90", "80;90", a list or a preset (ARCH_PRESETS); return CMake's semicolon list.

    Refuses architectures below sm_80 and, when ``nvcc_archs`` (``nvcc --list-gpu-arch``) is given, ones
    that nvcc does not know, each in one line.
    """
    if cuda_archs is None:
        return DEFAULT_CUDA_ARCHS
    items = re.split(r"[;,\s]+", cuda_archs) if isinstance(cuda_archs, str) else list(cuda_archs)
    archs: list[str] = []
    for item in (a.strip() for a in items if a and a.strip()):
        if item.lower() == "default":
            archs += DEFAULT_CUDA_ARCHS.split(";")
        elif item.lower() == "edge":
            archs += _edge_archs(nvcc_archs)
        else:
            archs.append(item)
    for arch in archs:
        match = re.fullmatch(r"(\d{2,3})[a-z]?(-real|-virtual)?", arch)
        if match is None:
            raise PluginBuildError(f"bad CUDA architecture {arch!r}: use numbers like 80;86;90 (optionally -real) "
                                   f"or a preset ({', '.join(ARCH_PRESETS)})")
        number = int(match.group(1))
        if number < MIN_CUDA_ARCH:
            raise PluginBuildError(f"CUDA architecture {arch} is not supported: the kernels need sm_80 or newer "
                                   "(cp.async); T4 (75), Xavier (72) and older GPUs are unsupported")
        if nvcc_archs is not None and number not in nvcc_archs:
            known = ";".join(str(a) for a in sorted(nvcc_archs))
            raise PluginBuildError(f"CUDA architecture {arch}: this nvcc does not support compute_{number} "
                                   f"(`nvcc --list-gpu-arch`: {known})")
    if not archs:
        raise PluginBuildError("empty CUDA architecture list: pass e.g. --cuda-arch 80;90")
    return ";".join(dict.fromkeys(archs))


def _on_path(name: str) -> str | None:
    """The program ``name`` in PATH's absolute folders: an empty or relative entry ("", ".", "bin") names the
    working directory, from which no program runs (docs/security.md#nothing-untrusted-runs)."""
    folders = [folder for folder in os.environ.get("PATH", os.defpath).split(os.pathsep) if os.path.isabs(folder)]
    return shutil.which(name, path=os.pathsep.join(folders))


def find_cmake() -> str:
    """cmake on PATH, else a PluginBuildError that says how to get it."""
    cmake = _on_path("cmake")
    if cmake is None:
        raise PluginBuildError("cmake not found: install CMake >= 3.18 (e.g. `pip install cmake`) and put it on PATH")
    return cmake


def find_nvcc() -> str:
    """$CUDACXX, nvcc on PATH or the usual install path; else a PluginBuildError."""
    env = os.environ.get("CUDACXX")
    if env:
        if not Path(env).is_file():
            raise PluginBuildError(f"CUDACXX={env} does not exist: point it at nvcc or unset it")
        return env
    found = _on_path("nvcc")
    if found:
        return found
    for candidate in NVCC_FALLBACKS:
        if Path(candidate).is_file():
            return candidate
    raise PluginBuildError("nvcc not found: install the CUDA toolkit or set CUDACXX to the path of nvcc")


def nvcc_version(nvcc: str) -> str:
    """The full ``nvcc --version`` text (the kernels key keys on it); a PluginBuildError when nvcc does not run."""
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PluginBuildError(f"nvcc at {nvcc} does not run ({exc}): fix the CUDA toolkit or set CUDACXX") from exc
    if proc.returncode != 0:
        raise PluginBuildError(f"`{nvcc} --version` failed (exit {proc.returncode}): "
                               "fix the CUDA toolkit or set CUDACXX")
    return proc.stdout


def nvcc_release(version_text: str) -> str | None:
    """The "Cuda compilation tools, release 13.0, V13.0.88" line of ``nvcc --version``."""
    match = re.search(r"^.*release \d+\.\d+.*$", version_text, flags=re.MULTILINE)
    return match.group(0).strip() if match else None


def nvcc_gpu_archs(nvcc: str) -> set[int] | None:
    """Virtual architectures nvcc compiles for (``--list-gpu-arch``: 80, 86, ...); None if it cannot say."""
    try:
        proc = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = {int(n) for n in re.findall(r"compute_(\d+)", proc.stdout)}
    return found if proc.returncode == 0 and found else None


def pip_tensorrt_lib_dirs() -> list[str]:
    """Folders of pip's TensorRT libraries (tensorrt_libs, tensorrt_cu12_libs, ...), found without importing them.

    ``importlib.util.find_spec`` of a top-level package reads no module code, so TensorRT is not loaded.
    """
    names = {"tensorrt_libs"} | {m.name for m in pkgutil.iter_modules() if _PIP_LIBS_RE.fullmatch(m.name)}
    folders: list[str] = []
    for name in sorted(names):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            if Path(location).is_dir() and str(location) not in folders:
                folders.append(str(location))
    return folders


def nvinfer_in(folder: Path, major: int | None) -> Path | None:
    """libnvinfer.so, else libnvinfer.so.<major> (pip ships only that), in ``folder``; None if neither."""
    names = ["libnvinfer.so"] + ([f"libnvinfer.so.{major}"] if major is not None else [])
    found = [folder / n for n in names if (folder / n).is_file()]
    if not found and major is None:
        found = sorted(folder.glob("libnvinfer.so.[0-9]*"))
    return found[0] if found else None


def find_tensorrt_include(tensorrt_root: str | os.PathLike[str] | None = None) -> Path | None:
    """The include dir holding NvInfer.h: under tensorrt_root, $TENSORRT_ROOT, or a system path."""
    roots = [tensorrt_root, os.environ.get("TENSORRT_ROOT")]
    candidates = [Path(r) / sub for r in roots if r for sub in ("include", ".")]
    candidates += [Path(p) for p in ("/usr/include", "/usr/include/x86_64-linux-gnu", "/usr/include/aarch64-linux-gnu",
                                     "/usr/local/include")]
    for directory in candidates:
        if (directory / "NvInfer.h").is_file():
            return directory.resolve()
    return None


def tensorrt_version(include_dir: Path) -> str | None:
    """ "major.minor.patch" from NvInferVersion.h (TensorRT 10 and 11 spell the macros differently)."""
    header = include_dir / "NvInferVersion.h"
    if not header.is_file():
        return None
    text = header.read_text(errors="replace")
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        match = re.search(rf"#define\s+(?:TRT_{part}_ENTERPRISE|NV_TENSORRT_{part})\s+(\d+)", text)
        if match is None:
            return None
        parts.append(match.group(1))
    return ".".join(parts)


def include_under(root: Path) -> Path | None:
    """root/include or root itself when it holds NvInfer.h (what CMake's find_path with PATH_SUFFIXES include sees)."""
    for directory in (root / "include", root):
        if (directory / "NvInfer.h").is_file():
            return directory.resolve()
    return None


@dataclass(frozen=True)
class TensorrtInputs:
    """Where the TensorRT headers and libnvinfer are, as found before CMake runs (include None: no headers)."""

    root: str | None
    """--tensorrt-root, else $TENSORRT_ROOT."""
    include: Path | None
    header: str | None
    """The text of NvInferVersion.h (the TensorRT key keys on it)."""
    major: int | None
    lib_dir: str | None
    """--tensorrt-lib: the only folder CMake searches for libnvinfer when given."""
    lib_hints: tuple[str, ...]
    """pip's tensorrt*_libs folders, searched after TENSORRT_ROOT/lib."""

    @property
    def version(self) -> str | None:
        return tensorrt_version(self.include) if self.include else None


def tensorrt_inputs(tensorrt_root: str | os.PathLike[str] | None,
                    tensorrt_lib: str | os.PathLike[str] | None) -> TensorrtInputs:
    """Find the headers; refuse, in one line, a --tensorrt-root without them or a --tensorrt-lib without libnvinfer."""
    if tensorrt_root and not Path(tensorrt_root).is_dir():
        raise PluginBuildError(f"--tensorrt-root {tensorrt_root} is not a directory: pass the folder holding include/")
    root = str(Path(tensorrt_root).resolve()) if tensorrt_root else os.environ.get("TENSORRT_ROOT") or None
    include = find_tensorrt_include(root) if not tensorrt_root else include_under(Path(root or "."))
    if tensorrt_root and include is None:
        raise PluginBuildError(f"--tensorrt-root {tensorrt_root} has no include/NvInfer.h: pass the TensorRT "
                               "folder that holds include/ (pip wheels ship no headers: use a TensorRT tar or "
                               "NVIDIA/TensorRT's include/ of the same version)")
    version_header = include / "NvInferVersion.h" if include else None
    header = version_header.read_text(errors="replace") if version_header and version_header.is_file() else None
    major = major_of(tensorrt_version(include)) if include else None
    lib_dir = None
    if tensorrt_lib is not None:
        lib_path = Path(tensorrt_lib)
        if not lib_path.is_dir() or nvinfer_in(lib_path, major) is None:
            wanted = f"libnvinfer.so or libnvinfer.so.{major}" if major is not None else "libnvinfer.so"
            raise PluginBuildError(f"--tensorrt-lib {tensorrt_lib} holds no {wanted}: pass the folder that "
                                   "holds it (pip: site-packages/tensorrt_libs)")
        lib_dir = str(lib_path.resolve())
    return TensorrtInputs(root, include, header, major, lib_dir, tuple(pip_tensorrt_lib_dirs()))
