"""Compile the native libraries on the machine that runs them (CMake + nvcc), cached by source hash.

The plugins ship as sources because a library is tied to its CUDA and TensorRT versions and to the GPU
architectures; building on the target is the only way to match all three.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pkgutil
import re
import shutil
import subprocess
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from attnres_export.errors import PluginBuildError

SOURCE_DIR = Path(__file__).resolve().parent
"""CMake project root: the sources inside the installed package."""

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
_NVINFER_RE = re.compile(r"attnres: libnvinfer: (.+)")
_PIP_LIBS_RE = re.compile(r"tensorrt(_cu\d+)?_libs")
"""pip's folders of TensorRT's shared libraries: tensorrt_libs, tensorrt_cu12_libs, tensorrt_cu13_libs, ..."""


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
    nvcc_version: str | None = None
    """nvcc's "Cuda compilation tools, release X.Y, VX.Y.Z" line."""
    nvinfer: str | None = None
    """The libnvinfer the TensorRT libraries were linked against."""

    @property
    def tensorrt_major(self) -> int | None:
        """Major version of the TensorRT headers the plugin libraries were compiled with."""
        return major_of(self.tensorrt_version)

    def libraries(self) -> dict[str, Path]:
        """Name -> path of every library that was built."""
        found = {"kernels": self.kernels, "trt": self.trt, "trt_dyn": self.trt_dyn}
        return {name: path for name, path in found.items() if path is not None}


def default_cache_dir() -> Path:
    """``$ATTNRES_PLUGIN_CACHE`` or ``~/.cache/attnres/plugins``: one sub-folder per build hash."""
    env = os.environ.get("ATTNRES_PLUGIN_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "attnres" / "plugins"


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


def source_files(source_dir: Path = SOURCE_DIR) -> list[Path]:
    """Every file that affects the build (sorted, so the hash is stable)."""
    files = [
        p for p in source_dir.rglob("*") if p.is_file() and (p.suffix in SOURCE_SUFFIXES or p.name == "CMakeLists.txt")
    ]
    return sorted(files, key=lambda p: p.relative_to(source_dir).as_posix())


def build_hash(
    tensorrt_root: str | None,
    cuda_archs: str,
    kernels_only: bool,
    nvcc: str,
    source_dir: Path = SOURCE_DIR,
    *,
    tensorrt_header: str | None = None,
    nvcc_version: str | None = None,
    tensorrt_lib: str | None = None,
    tensorrt_lib_hints: Sequence[str] = (),
) -> str:
    """Hash of the sources and the options: a different hash is a different library.

    Besides the paths it keys on what the paths hold: ``tensorrt_header`` (the text of NvInferVersion.h) and
    ``nvcc_version`` (``nvcc --version``), so a TensorRT or CUDA upgrade in place is a new build.
    """
    digest = hashlib.sha256()
    options = {
        "trt": tensorrt_root,
        "archs": cuda_archs,
        "kernels_only": kernels_only,
        "nvcc": nvcc,
        "trt_header": tensorrt_header,
        "nvcc_version": nvcc_version,
        "trt_lib": tensorrt_lib,
        "trt_lib_hints": list(tensorrt_lib_hints),
    }
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


def nvcc_version(nvcc: str) -> str:
    """The full ``nvcc --version`` text (the build hash keys on it); a PluginBuildError when nvcc does not run."""
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


def _run(command: list[str], log: Path, what: str, fix: str,
         explain: Callable[[str], str | None] | None = None) -> str:
    """Run a build step, appending to the log; a failure is one line (``explain(output)`` when it knows why)."""
    with log.open("a") as handle:
        handle.write("$ " + " ".join(command) + "\n")
        handle.flush()
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        handle.write(proc.stdout)
    if proc.returncode != 0:
        known = explain(proc.stdout) if explain else None
        if known:
            raise PluginBuildError(f"{known} (log: {log})")
        raise PluginBuildError(f"{what} failed (exit {proc.returncode}); {fix}; compiler log: {log}")
    return proc.stdout


def _explain_configure(output: str, major: int | None) -> str | None:
    """One line for the configure failures CMakeLists.txt reports about libnvinfer."""
    text = " ".join(output.split())  # CMake wraps its messages
    wanted = f"libnvinfer.so or libnvinfer.so.{major}" if major is not None else "libnvinfer.so or libnvinfer.so.N"
    if "attnres: libnvinfer not found" in text:
        return (f"libnvinfer{f' (TensorRT {major})' if major is not None else ''} not found for the TensorRT "
                f"libraries: pass --tensorrt-lib DIR (the folder holding {wanted}; pip: site-packages/tensorrt_libs) "
                "or set TENSORRT_ROOT to a TensorRT folder with lib/, or build only the kernels with --kernels-only")
    mismatch = re.search(r"attnres: libnvinfer mismatch: (\S+) is TensorRT (\d+)", text)
    if mismatch:
        return (f"{mismatch.group(1)} is TensorRT {mismatch.group(2)} but the headers are TensorRT {major}: "
                "pass --tensorrt-lib DIR with the libnvinfer of the headers' TensorRT")
    return None


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
        nvcc_version=info.get("nvcc_version"),
        nvinfer=info.get("nvinfer"),
    )


def build_plugins(
    out_dir: str | os.PathLike[str] | None = None,
    tensorrt_root: str | os.PathLike[str] | None = None,
    cuda_archs: str | Sequence[str] | None = None,
    kernels_only: bool = False,
    jobs: int = 2,
    console: Console | None = None,
    tensorrt_lib: str | os.PathLike[str] | None = None,
) -> BuildResult:
    """Configure and build the libraries, or return the cached build of the same sources and options.

    ``tensorrt_root``: TensorRT folder with include/NvInfer.h (else ``$TENSORRT_ROOT``, else the system include
    folders; without headers only the kernels library is built). ``tensorrt_lib``: the folder holding libnvinfer
    (libnvinfer.so or pip's libnvinfer.so.<major>), else TENSORRT_ROOT/lib(64), pip's tensorrt*_libs and the
    system library folders are searched; the TensorRT libraries link it, and not finding it is an error.
    ``cuda_archs``: numbers such as "80;90" or a preset ("edge" = Jetson Orin 87 + Thor 110); the default
    80-real;86-real;89-real;90 = A100/A10/L4/H100 SASS plus PTX of 90. Below 80 (T4, Xavier) is refused.
    """
    console = console or Console(stderr=True)
    cmake = find_cmake()
    nvcc = find_nvcc()
    nvcc_text = nvcc_version(nvcc)
    archs = normalize_archs(cuda_archs, nvcc_gpu_archs(nvcc))
    if tensorrt_root and not Path(tensorrt_root).is_dir():
        raise PluginBuildError(f"--tensorrt-root {tensorrt_root} is not a directory: pass the folder holding include/")
    root = str(Path(tensorrt_root).resolve()) if tensorrt_root else os.environ.get("TENSORRT_ROOT") or None
    include = header = lib_dir = None
    lib_hints: list[str] = []
    if not kernels_only:
        include = find_tensorrt_include(root) if not tensorrt_root else _include_under(Path(root))
        if tensorrt_root and include is None:
            raise PluginBuildError(f"--tensorrt-root {tensorrt_root} has no include/NvInfer.h: pass the TensorRT "
                                   "folder that holds include/ (pip wheels ship no headers: use a TensorRT tar or "
                                   "NVIDIA/TensorRT's include/ of the same version)")
        version_header = include / "NvInferVersion.h" if include else None
        header = version_header.read_text(errors="replace") if version_header and version_header.is_file() else None
        major = major_of(tensorrt_version(include)) if include else None
        if tensorrt_lib is not None:
            lib_path = Path(tensorrt_lib)
            if not lib_path.is_dir() or nvinfer_in(lib_path, major) is None:
                wanted = f"libnvinfer.so or libnvinfer.so.{major}" if major is not None else "libnvinfer.so"
                raise PluginBuildError(f"--tensorrt-lib {tensorrt_lib} holds no {wanted}: pass the folder that "
                                       "holds it (pip: site-packages/tensorrt_libs)")
            lib_dir = str(lib_path.resolve())
        lib_hints = pip_tensorrt_lib_dirs()
    else:
        major = None
        root = None
    digest = build_hash(root, archs, kernels_only, nvcc, tensorrt_header=header, nvcc_version=nvcc_text,
                        tensorrt_lib=lib_dir, tensorrt_lib_hints=lib_hints)
    target = Path(out_dir) if out_dir else default_cache_dir() / digest
    cached = _load_info(target, digest)
    if cached is not None:
        return cached

    build_dir = target / "build"
    lib_out = target / "lib"
    build_dir.mkdir(parents=True, exist_ok=True)
    # A new hash in the same folder: CMake must search again (found paths are cached in CMakeCache.txt).
    (build_dir / "CMakeCache.txt").unlink(missing_ok=True)
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
        f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={lib_out}",
        f"-DATTNRES_BUILD_TRT={'OFF' if kernels_only else 'ON'}",
    ]
    if root:
        configure.append(f"-DTENSORRT_ROOT={root}")
    if include:
        configure.append(f"-DTENSORRT_INCLUDE_DIR={include}")
    if lib_dir:
        configure.append(f"-DTENSORRT_LIB_DIR={lib_dir}")
    if lib_hints:
        configure.append(f"-DTENSORRT_LIB_HINTS={';'.join(lib_hints)}")
    build = [cmake, "--build", str(build_dir), "--parallel", str(max(1, jobs))]
    if kernels_only:
        build += ["--target", "attnres_kernels"]
    with console.status("[bold]attnres: configuring plugins (cmake)…"):
        output = _run(configure, log, "cmake configure", "check the CUDA toolkit and CMake versions",
                      explain=lambda out: _explain_configure(out, major))
    with console.status(f"[bold]attnres: compiling plugins for CUDA archs {archs}…"):
        _run(build, log, "plugin build", "fix the compiler error shown in the log")

    found = _TRT_INCLUDE_RE.search(output)
    trt_include = found.group(1).strip() if found and not found.group(1).startswith("none") else None
    version = _TRT_VERSION_RE.search(output)
    nvinfer = _NVINFER_RE.search(output)
    libs: dict[str, Path | None] = {
        "kernels": lib_out / KERNELS_LIB,
        "trt": (lib_out / TRT_LIB) if trt_include and not kernels_only else None,
        "trt_dyn": (lib_out / TRT_DYN_LIB) if trt_include and not kernels_only else None,
    }
    for name, path in libs.items():
        if path is not None and not path.is_file():
            raise PluginBuildError(f"the build reported success but {name} library {path} is missing; log: {log}")
    info = {
        "hash": digest,
        "libraries": {k: (str(v) if v else None) for k, v in libs.items()},
        "tensorrt_include": trt_include,
        "tensorrt_version": version.group(1) if version and trt_include else None,
        "nvinfer": nvinfer.group(1).strip() if nvinfer and trt_include else None,
        "nvcc": nvcc,
        "nvcc_version": nvcc_release(nvcc_text),
        "cuda_archs": archs,
    }
    (target / INFO_FILE).write_text(json.dumps(info, indent=2))
    result = _load_info(target, digest)
    if result is None:
        raise PluginBuildError(f"could not read back {target / INFO_FILE}; delete {target} and build again")
    return BuildResult(**{**result.__dict__, "cached": False})


def _include_under(root: Path) -> Path | None:
    """root/include or root itself when it holds NvInfer.h (what CMake's find_path with PATH_SUFFIXES include sees)."""
    for directory in (root / "include", root):
        if (directory / "NvInfer.h").is_file():
            return directory.resolve()
    return None


def find_libraries(cache_dir: str | os.PathLike[str] | None = None, tensorrt_major: int | None = None,
                   with_tensorrt: bool = False) -> BuildResult | None:
    """The most recent complete build in the cache, or None when nothing has been built.

    ``with_tensorrt``: the most recent build that has the TensorRT libraries (a later kernels-only build, such
    as the self-test's, does not hide it). ``tensorrt_major``: the most recent build whose TensorRT libraries
    were compiled against headers of that major version (the plugin ABI changes between majors).
    """
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    if not root.is_dir():
        return None
    infos = sorted(root.glob(f"*/{INFO_FILE}"), key=lambda p: p.stat().st_mtime, reverse=True)
    for info in infos:
        result = _load_info(info.parent, "*")
        if result is None:
            continue
        if (with_tensorrt or tensorrt_major is not None) and result.trt is None:
            continue
        if tensorrt_major is None or result.tensorrt_major == tensorrt_major:
            return result
    return None


def recorded_tensorrt_version(library: str | os.PathLike[str]) -> str | None:
    """The TensorRT headers version build-info.json records for ``library`` (a built lib/<name>.so), if any."""
    path = Path(library).resolve()
    info_path = path.parent.parent / INFO_FILE
    try:
        info = json.loads(info_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    libraries = {str(Path(v).resolve()) for v in info.get("libraries", {}).values() if v}
    return info.get("tensorrt_version") if str(path) in libraries else None
