"""Compile the native libraries on the machine that runs them (CMake + nvcc), cached by source hash.

The plugins ship as sources because a library is tied to its CUDA and TensorRT versions and to the GPU
architectures; building on the target is the only way to match all three.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from attnres_export.errors import PluginBuildError

SOURCE_DIR = Path(__file__).resolve().parent
"""CMake project root: the sources inside the installed package."""

DEFAULT_CUDA_ARCHS = "80-real;86-real;89-real;90"
"""SASS for Ampere, Ada and Hopper plus PTX of sm_90 so newer GPUs can JIT it."""

SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cpp", ".cmake")
KERNELS_LIB = "libattnres_kernels.so"
TRT_LIB = "libattnres_trt.so"
TRT_DYN_LIB = "libattnres_trt_dyn.so"
INFO_FILE = "build-info.json"
LOG_FILE = "build.log"
NVCC_FALLBACKS = ("/usr/local/cuda/bin/nvcc",)
"""Where nvcc usually lives when it is not on PATH."""

_TRT_INCLUDE_RE = re.compile(r"attnres: TensorRT include dir: (.+)")
_TRT_VERSION_RE = re.compile(r"attnres: TensorRT headers version: ([0-9.]+)")


@dataclass(frozen=True)
class BuildResult:
    """Where the built libraries are and what they were built against."""

    out_dir: Path
    kernels: Path
    trt: Path | None
    trt_dyn: Path | None
    tensorrt_include: str | None
    tensorrt_version: str | None
    cuda_archs: str
    cached: bool
    log: Path

    def libraries(self) -> dict[str, Path]:
        """Name -> path of every library that was built."""
        found = {"kernels": self.kernels, "trt": self.trt, "trt_dyn": self.trt_dyn}
        return {name: path for name, path in found.items() if path is not None}


def default_cache_dir() -> Path:
    """``$ATTNRES_PLUGIN_CACHE`` or ``~/.cache/attnres/plugins``: one sub-folder per build hash."""
    env = os.environ.get("ATTNRES_PLUGIN_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "attnres" / "plugins"


def normalize_archs(cuda_archs: str | Sequence[str] | None) -> str:
    """Accept "80,90", "80;90" or a list; return CMake's semicolon list."""
    if cuda_archs is None:
        return DEFAULT_CUDA_ARCHS
    items = re.split(r"[;,\s]+", cuda_archs) if isinstance(cuda_archs, str) else list(cuda_archs)
    archs = [a.strip() for a in items if a and a.strip()]
    for arch in archs:
        if not re.fullmatch(r"\d{2,3}[a-z]?(-real|-virtual)?", arch):
            raise PluginBuildError(f"bad CUDA architecture {arch!r}: use numbers like 80;86;90 (optionally -real)")
    if not archs:
        raise PluginBuildError("empty CUDA architecture list: pass e.g. --cuda-arch 80;90")
    return ";".join(archs)


def source_files(source_dir: Path = SOURCE_DIR) -> list[Path]:
    """Every file that affects the build (sorted, so the hash is stable)."""
    files = [
        p for p in source_dir.rglob("*") if p.is_file() and (p.suffix in SOURCE_SUFFIXES or p.name == "CMakeLists.txt")
    ]
    return sorted(files, key=lambda p: p.relative_to(source_dir).as_posix())


def build_hash(
    tensorrt_root: str | None, cuda_archs: str, kernels_only: bool, nvcc: str, source_dir: Path = SOURCE_DIR
) -> str:
    """Hash of the sources and the options: a different hash is a different library."""
    digest = hashlib.sha256()
    options = {"trt": tensorrt_root, "archs": cuda_archs, "kernels_only": kernels_only, "nvcc": nvcc}
    digest.update(json.dumps(options, sort_keys=True).encode())
    for path in source_files(source_dir):
        digest.update(path.relative_to(source_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def find_cmake() -> str:
    """cmake on PATH, else a PluginBuildError that says how to get it."""
    cmake = shutil.which("cmake")
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
    found = shutil.which("nvcc")
    if found:
        return found
    for candidate in NVCC_FALLBACKS:
        if Path(candidate).is_file():
            return candidate
    raise PluginBuildError("nvcc not found: install the CUDA toolkit or set CUDACXX to the path of nvcc")


def find_tensorrt_include(tensorrt_root: str | os.PathLike[str] | None = None) -> Path | None:
    """The include dir holding NvInfer.h: under tensorrt_root, $TENSORRT_ROOT, or a system path."""
    roots = [tensorrt_root, os.environ.get("TENSORRT_ROOT")]
    candidates = [Path(r) / sub for r in roots if r for sub in ("include", ".")]
    candidates += [Path(p) for p in ("/usr/include", "/usr/include/x86_64-linux-gnu", "/usr/local/include")]
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


def _run(command: list[str], log: Path, what: str, fix: str) -> str:
    with log.open("a") as handle:
        handle.write("$ " + " ".join(command) + "\n")
        handle.flush()
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        handle.write(proc.stdout)
    if proc.returncode != 0:
        raise PluginBuildError(f"{what} failed (exit {proc.returncode}); {fix}; compiler log: {log}")
    return proc.stdout


def _load_info(out_dir: Path, expected_hash: str) -> BuildResult | None:
    info_path = out_dir / INFO_FILE
    if not info_path.is_file():
        return None
    try:
        info = json.loads(info_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if info.get("hash") != expected_hash and expected_hash != "*":
        return None
    libs = {k: (Path(v) if v else None) for k, v in info.get("libraries", {}).items()}
    if libs.get("kernels") is None or not all(p.is_file() for p in libs.values() if p is not None):
        return None
    return BuildResult(
        out_dir=out_dir,
        kernels=libs["kernels"],
        trt=libs.get("trt"),
        trt_dyn=libs.get("trt_dyn"),
        tensorrt_include=info.get("tensorrt_include"),
        tensorrt_version=info.get("tensorrt_version"),
        cuda_archs=info.get("cuda_archs", ""),
        cached=True,
        log=out_dir / LOG_FILE,
    )


def build_plugins(
    out_dir: str | os.PathLike[str] | None = None,
    tensorrt_root: str | os.PathLike[str] | None = None,
    cuda_archs: str | Sequence[str] | None = None,
    kernels_only: bool = False,
    jobs: int = 2,
    console: Console | None = None,
) -> BuildResult:
    """Configure and build the libraries, or return the cached build of the same sources and options."""
    console = console or Console(stderr=True)
    archs = normalize_archs(cuda_archs)
    cmake = find_cmake()
    nvcc = find_nvcc()
    root = str(Path(tensorrt_root).resolve()) if tensorrt_root else os.environ.get("TENSORRT_ROOT") or None
    if tensorrt_root and not Path(tensorrt_root).is_dir():
        raise PluginBuildError(f"--tensorrt-root {tensorrt_root} is not a directory: pass the folder holding include/")
    digest = build_hash(root, archs, kernels_only, nvcc)
    target = Path(out_dir) if out_dir else default_cache_dir() / digest
    cached = _load_info(target, digest)
    if cached is not None:
        return cached

    build_dir = target / "build"
    lib_dir = target / "lib"
    build_dir.mkdir(parents=True, exist_ok=True)
    log = target / LOG_FILE
    log.write_text("")
    configure = [
        cmake,
        "-S",
        str(SOURCE_DIR),
        "-B",
        str(build_dir),
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DCMAKE_CUDA_COMPILER={nvcc}",
        f"-DCMAKE_CUDA_ARCHITECTURES={archs}",
        f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={lib_dir}",
        f"-DATTNRES_BUILD_TRT={'OFF' if kernels_only else 'ON'}",
    ]
    if root:
        configure.append(f"-DTENSORRT_ROOT={root}")
    build = [cmake, "--build", str(build_dir), "--parallel", str(max(1, jobs))]
    if kernels_only:
        build += ["--target", "attnres_kernels"]
    with console.status("[bold]attnres: configuring plugins (cmake)…"):
        output = _run(configure, log, "cmake configure", "check the CUDA toolkit and CMake versions")
    with console.status(f"[bold]attnres: compiling plugins for CUDA archs {archs}…"):
        _run(build, log, "plugin build", "fix the compiler error shown in the log")

    include = _TRT_INCLUDE_RE.search(output)
    trt_include = include.group(1).strip() if include and not include.group(1).startswith("none") else None
    version = _TRT_VERSION_RE.search(output)
    libs: dict[str, Path | None] = {
        "kernels": lib_dir / KERNELS_LIB,
        "trt": (lib_dir / TRT_LIB) if trt_include and not kernels_only else None,
        "trt_dyn": (lib_dir / TRT_DYN_LIB) if trt_include and not kernels_only else None,
    }
    for name, path in libs.items():
        if path is not None and not path.is_file():
            raise PluginBuildError(f"the build reported success but {name} library {path} is missing; log: {log}")
    info = {
        "hash": digest,
        "libraries": {k: (str(v) if v else None) for k, v in libs.items()},
        "tensorrt_include": trt_include,
        "tensorrt_version": version.group(1) if version and trt_include else None,
        "cuda_archs": archs,
    }
    (target / INFO_FILE).write_text(json.dumps(info, indent=2))
    result = _load_info(target, digest)
    if result is None:
        raise PluginBuildError(f"could not read back {target / INFO_FILE}; delete {target} and build again")
    return BuildResult(**{**result.__dict__, "cached": False})


def find_libraries(cache_dir: str | os.PathLike[str] | None = None) -> BuildResult | None:
    """The most recent complete build in the cache, or None when nothing has been built."""
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    if not root.is_dir():
        return None
    infos = sorted(root.glob(f"*/{INFO_FILE}"), key=lambda p: p.stat().st_mtime, reverse=True)
    for info in infos:
        result = _load_info(info.parent, "*")
        if result is not None:
            return result
    return None
