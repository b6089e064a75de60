"""Compile the native libraries on the machine that runs them (CMake + nvcc), cached by source hash.

The plugins ship as sources because a library is tied to its CUDA and TensorRT versions and to the GPU
architectures; building on the target is the only way to match all three.

One folder per kernels key (sources, architectures, nvcc) holds one CMake tree and the kernels library; the
TensorRT libraries are linked in that tree from the same kernel objects, into ``tensorrt-<key>/`` inside it (one
per TensorRT), so ``--kernels-only`` and a full build compile the kernels once between them. Progress goes to a
``status`` callback and the result is data (per library: built, cached or skipped, and why); the command line
renders it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, NamedTuple

from attnres_export.atomic import write_text_atomic
from attnres_export.errors import PluginBuildError
from attnres_export.plugins.build_progress import NVCC_VERBOSE, BuildProgress
from attnres_export.plugins.toolchain import (
    TensorrtInputs,
    find_cmake,
    find_nvcc,
    major_of,
    normalize_archs,
    nvcc_gpu_archs,
    nvcc_release,
    nvcc_version,
    tensorrt_inputs,
)

SOURCE_DIR = Path(__file__).resolve().parent
"""CMake project root: the sources inside the installed package."""

SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cpp", ".cmake")
KERNELS_LIB = "libattnres_kernels.so"
TRT_LIB = "libattnres_trt.so"
TRT_DYN_LIB = "libattnres_trt_dyn.so"
INFO_FILE = "build-info.json"
LOG_FILE = "build.log"
LOCK_FILE = ".lock"
TENSORRT_DIR_PREFIX = "tensorrt-"
"""The TensorRT libraries of a kernels folder live in ``tensorrt-<tensorrt_key>/lib`` inside it."""

TICK_SECONDS = 5.0
STILL_COMPILING_SECONDS = 60.0
"""A compile step that prints nothing for this long (one kernel file for four architectures, or any file under
ninja, which prints a step when it ends) gets a "still compiling" line, once per such interval."""

KERNELS_TARGET = "attnres_kernels"
TENSORRT_TARGETS = ("attnres_trt", "attnres_trt_dyn")
"""CMake targets (CMakeLists.txt)."""

_TRT_INCLUDE_RE = re.compile(r"attnres: TensorRT include dir: (.+)")
_TRT_VERSION_RE = re.compile(r"attnres: TensorRT headers version: ([0-9.]+)")
_NVINFER_RE = re.compile(r"attnres: libnvinfer: (.+)")

BUILT, CACHED, SKIPPED = "built", "cached", "skipped"
"""What happened to a library in one build_plugins call."""


@dataclass(frozen=True)
class LibraryOutcome:
    """One library of a build: built now, reused from the cache, or skipped and why."""

    name: str
    """kernels, trt or trt_dyn (the keys of BuildResult.libraries())."""
    file: str
    path: Path | None
    state: str
    why: str = ""


@dataclass(frozen=True)
class BuildResult:
    """Where the built libraries are and what they were built against.

    ``out_dir`` holds this result's build-info.json: the kernels folder, or its ``tensorrt-<key>`` folder when
    the TensorRT libraries are part of the result."""

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
    outcomes: tuple[LibraryOutcome, ...] = ()
    """Per library, what this build_plugins call did (empty for a result read back by find_libraries)."""
    not_built: str | None = None
    """Why the TensorRT libraries were asked for and not built, with the fix, in one line; None otherwise."""

    @property
    def tensorrt_major(self) -> int | None:
        """Major version of the TensorRT headers the plugin libraries were compiled with."""
        return major_of(self.tensorrt_version)

    def libraries(self) -> dict[str, Path]:
        """Name -> path of every library that was built."""
        found = {"kernels": self.kernels, "trt": self.trt, "trt_dyn": self.trt_dyn}
        return {name: path for name, path in found.items() if path is not None}


def default_cache_dir() -> Path:
    """``$ATTNRES_PLUGIN_CACHE`` or ``~/.cache/attnres/plugins``: one sub-folder per kernels key."""
    env = os.environ.get("ATTNRES_PLUGIN_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "attnres" / "plugins"


def source_files(source_dir: Path = SOURCE_DIR) -> list[Path]:
    """Every file that affects the build (sorted, so the hash is stable)."""
    files = [
        p for p in source_dir.rglob("*") if p.is_file() and (p.suffix in SOURCE_SUFFIXES or p.name == "CMakeLists.txt")
    ]
    return sorted(files, key=lambda p: p.relative_to(source_dir).as_posix())


def _digest(options: dict, source_dir: Path | None = None) -> str:
    digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    for path in source_files(source_dir) if source_dir is not None else []:
        digest.update(path.relative_to(source_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def kernels_key(cuda_archs: str, nvcc: str, source_dir: Path = SOURCE_DIR, *, nvcc_version: str | None = None,
                generator: str | None = None) -> str:
    """Hash of every source, the architectures and nvcc: the kernels folder, the same for every build mode.

    It keys on what nvcc is (``nvcc --version``), not only on its path, so a CUDA upgrade in place is a new
    build; on the CMake generator (``$CMAKE_GENERATOR``), because a CMake tree keeps its generator; and on the
    sources' folder, so that two installs never share a tree.
    """
    options = {"archs": cuda_archs, "nvcc": nvcc, "nvcc_version": nvcc_version, "generator": generator,
               "sources": str(source_dir)}
    return _digest(options, source_dir)


def tensorrt_key(kernels_hash: str, tensorrt_root: str | None, *, tensorrt_include: str | None = None,
                 tensorrt_header: str | None = None, tensorrt_lib: str | None = None,
                 tensorrt_lib_hints: Sequence[str] = ()) -> str:
    """Hash of the kernels key and the TensorRT inputs: one ``tensorrt-<key>`` folder per TensorRT.

    It keys on ``tensorrt_header`` (the text of NvInferVersion.h), not only on the paths, so a TensorRT upgrade
    in place is a new build.
    """
    return _digest({"kernels": kernels_hash, "trt": tensorrt_root, "include": tensorrt_include,
                    "trt_header": tensorrt_header, "trt_lib": tensorrt_lib, "trt_lib_hints": list(tensorrt_lib_hints)})


def _quiet(_line: str) -> None:
    """The default progress callback: say nothing."""


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    """Hand every line of ``stream`` to ``lines``, then None."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def _run(command: list[str], log: Path, progress: Callable[[str], None] = _quiet,
         env: dict[str, str] | None = None, tick: Callable[[], None] = lambda: None) -> tuple[int, str]:
    """Run a build step, streaming its output into the log and each line to ``progress``; (exit code, output).

    ``tick`` runs every TICK_SECONDS without output, so that a long silent step can still be reported."""
    lines: list[str] = []
    with log.open("a") as handle:
        handle.write("$ " + " ".join(command) + "\n")
        handle.flush()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", env=env)
        pending: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_pump, args=(proc.stdout, pending), daemon=True)
        reader.start()
        try:
            while True:
                try:
                    line = pending.get(timeout=TICK_SECONDS)
                except queue.Empty:
                    tick()
                    continue
                if line is None:
                    break
                handle.write(line)
                lines.append(line)
                progress(line)
            code = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            reader.join(timeout=TICK_SECONDS)
    return code, "".join(lines)


def _failed(what: str, code: int, fix: str, log: Path) -> PluginBuildError:
    return PluginBuildError(f"{what} failed (exit {code}); {fix}; compiler log: {log}")


class _Skip(NamedTuple):
    """Why the TensorRT libraries are not built: a few words for the table, and the one line with the fix when
    they were asked for (None for --kernels-only)."""

    why: str
    line: str | None


def _explain_configure(output: str, major: int | None) -> _Skip | None:
    """What and why, with the fix, for the configure failures CMakeLists.txt reports about libnvinfer."""
    text = " ".join(output.split())  # CMake wraps its messages
    wanted = f"libnvinfer.so or libnvinfer.so.{major}" if major is not None else "libnvinfer.so or libnvinfer.so.N"
    if "attnres: libnvinfer not found" in text:
        which = f" (TensorRT {major})" if major is not None else ""
        return _Skip("libnvinfer not found",
                     f"libnvinfer{which} not found for the TensorRT libraries: pass --tensorrt-lib DIR (the folder "
                     f"holding {wanted}; pip: site-packages/tensorrt_libs) or set TENSORRT_ROOT to a TensorRT folder "
                     "with lib/, or build only the kernels with --kernels-only")
    mismatch = re.search(r"attnres: libnvinfer mismatch: (\S+) is TensorRT (\d+)", text)
    if mismatch:
        return _Skip("libnvinfer of another TensorRT",
                     f"{mismatch.group(1)} is TensorRT {mismatch.group(2)} but the headers are TensorRT {major}, so "
                     "the TensorRT libraries were not built: pass --tensorrt-lib DIR with the libnvinfer of the "
                     "headers' TensorRT, or build only the kernels with --kernels-only")
    return None


def _load_info(out_dir: Path, expected_hash: str) -> BuildResult | None:
    """The build ``out_dir/build-info.json`` records, when its hash is ``expected_hash`` ("*": any) and every
    library it lists exists."""
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
        log=Path(info["log"]) if info.get("log") else out_dir / LOG_FILE,
        nvcc_version=info.get("nvcc_version"),
        nvinfer=info.get("nvinfer"),
    )


@dataclass(frozen=True)
class _Tree:
    """One kernels folder: its CMake tree, its lib/ and log, and what it is configured with."""

    folder: Path
    key: str
    cmake: str
    nvcc: str
    nvcc_text: str
    archs: str
    jobs: int
    status: Callable[[str], None]

    @property
    def build_dir(self) -> Path:
        return self.folder / "build"

    @property
    def lib_dir(self) -> Path:
        return self.folder / "lib"

    @property
    def log(self) -> Path:
        return self.folder / LOG_FILE

    def reset(self) -> None:
        """Start this folder over for a new key (``--out`` reused, or a folder of an older layout): CMake must
        search again (found paths are cached in CMakeCache.txt), and TensorRT libraries built from the old kernels
        go."""
        self.build_dir.mkdir(parents=True, exist_ok=True)
        (self.build_dir / "CMakeCache.txt").unlink(missing_ok=True)
        (self.folder / INFO_FILE).unlink(missing_ok=True)
        for stale in self.folder.glob(f"{TENSORRT_DIR_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        for stale_library in (TRT_LIB, TRT_DYN_LIB):  # lib/ of a folder built before the tensorrt-<key> layout
            (self.lib_dir / stale_library).unlink(missing_ok=True)
        self.log.write_text("")

    def configure(self, trt: TensorrtInputs | None) -> tuple[int, str]:
        """cmake configure, with the TensorRT targets when ``trt`` is given; (exit code, CMake's output).

        Every TensorRT option is given (empty when unset) and the libnvinfer found before is forgotten (-U), so
        nothing lingers from an earlier configure of this tree for another TensorRT."""
        command = [self.cmake, "-S", str(SOURCE_DIR), "-B", str(self.build_dir), "-DCMAKE_BUILD_TYPE=Release",
                   f"-DCMAKE_CUDA_COMPILER={self.nvcc}", f"-DCMAKE_CUDA_ARCHITECTURES={self.archs}",
                   f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={self.lib_dir}", f"-DATTNRES_BUILD_TRT={'ON' if trt else 'OFF'}"]
        if trt is not None:
            command += ["-UTENSORRT_NVINFER_LIBRARY", f"-DTENSORRT_ROOT={trt.root or ''}",
                        f"-DTENSORRT_INCLUDE_DIR={trt.include}", f"-DTENSORRT_LIB_DIR={trt.lib_dir or ''}",
                        f"-DTENSORRT_LIB_HINTS={';'.join(trt.lib_hints)}"]
        return _run(command, self.log)

    def compile(self, targets: Sequence[str]) -> None:
        """``cmake --build`` of ``targets``; nvcc runs with ``-v`` so that each architecture is a progress line."""
        progress = BuildProgress(self.archs)
        said = [time.monotonic()]

        def report(line: str) -> None:
            text = progress.feed(line)
            if text is not None:
                self.status(text)
                said[0] = time.monotonic()

        def still_compiling() -> None:
            quiet = time.monotonic() - said[0]
            if quiet >= STILL_COMPILING_SECONDS:
                self.status(f"still compiling ({quiet:.0f} s since the last step)")
                said[0] = time.monotonic()

        env = dict(os.environ)
        env["NVCC_APPEND_FLAGS"] = f"{env.get('NVCC_APPEND_FLAGS', '')} {NVCC_VERBOSE}".strip()
        command = [self.cmake, "--build", str(self.build_dir), "--parallel", str(max(1, self.jobs)), "--target",
                   *targets]
        code, _ = _run(command, self.log, progress=report, env=env, tick=still_compiling)
        if code != 0:
            raise _failed("plugin build", code, "fix the compiler error shown in the log", self.log)

    def build_kernels(self) -> BuildResult:
        """Configure without TensorRT, compile the kernels library and record it."""
        self.status(f"kernels: configuring (cmake, CUDA architectures {self.archs})")
        code, _ = self.configure(None)
        if code != 0:
            raise _failed("cmake configure", code, "check the CUDA toolkit and CMake versions", self.log)
        self.status(f"kernels: compiling for {self.archs} (each kernel file once per architecture)")
        self.compile([KERNELS_TARGET])
        return self.record_kernels()

    def record_kernels(self) -> BuildResult:
        """Write the kernels folder's build-info.json and read it back."""
        kernels = self.lib_dir / KERNELS_LIB
        if not kernels.is_file():
            raise PluginBuildError(f"the build reported success but {kernels} is missing; log: {self.log}")
        info = {"hash": self.key, "libraries": {"kernels": str(kernels)}, "nvcc": self.nvcc,
                "nvcc_version": nvcc_release(self.nvcc_text), "cuda_archs": self.archs, "log": str(self.log)}
        return self._write_info(self.folder, info)

    def record_tensorrt(self, trt_folder: Path, key: str, kernels: Path, configure_output: str) -> BuildResult:
        """Move the TensorRT libraries out of the shared lib/ into ``trt_folder/lib`` (so that a build for another
        TensorRT never overwrites them) and write their build-info.json."""
        found = _TRT_INCLUDE_RE.search(configure_output)
        trt_include = found.group(1).strip() if found and not found.group(1).startswith("none") else None
        version = _TRT_VERSION_RE.search(configure_output)
        nvinfer = _NVINFER_RE.search(configure_output)
        libraries = {"kernels": str(kernels)}
        (trt_folder / "lib").mkdir(parents=True, exist_ok=True)
        for name, file in (("trt", TRT_LIB), ("trt_dyn", TRT_DYN_LIB)):
            built = self.lib_dir / file
            if not built.is_file():
                raise PluginBuildError(f"the build reported success but {built} is missing; log: {self.log}")
            os.replace(built, trt_folder / "lib" / file)
            libraries[name] = str(trt_folder / "lib" / file)
        info = {
            "hash": key,
            "kernels_hash": self.key,
            "libraries": libraries,
            "tensorrt_include": trt_include,
            "tensorrt_version": version.group(1) if version and trt_include else None,
            "nvinfer": nvinfer.group(1).strip() if nvinfer and trt_include else None,
            "nvcc": self.nvcc,
            "nvcc_version": nvcc_release(self.nvcc_text),
            "cuda_archs": self.archs,
            "log": str(self.log),
        }
        return self._write_info(trt_folder, info)

    @staticmethod
    def _write_info(folder: Path, info: dict) -> BuildResult:
        write_text_atomic(folder / INFO_FILE, json.dumps(info, indent=2))
        result = _load_info(folder, info["hash"])
        if result is None:
            raise PluginBuildError(f"could not read back {folder / INFO_FILE}; delete {folder} and build again")
        return replace(result, cached=False)


_BUILD_ENTRIES = ("build", "lib", LOG_FILE, INFO_FILE, LOCK_FILE)
"""What a build writes into its folder, besides its ``tensorrt-<key>/`` folders."""
_TENSORRT_ENTRIES = ("lib", INFO_FILE)


def _refuse_foreign_folder(folder: Path) -> None:
    """``--out`` is new, empty or a build folder: a build removes the ``tensorrt-*`` folders, the log and the info of
    an earlier build there, which in any other folder would be files of the user's."""
    if folder.exists() and not folder.is_dir():
        raise PluginBuildError(f"--out {folder} is not a folder; choose a new or empty folder")
    stranger = _stranger(folder, _BUILD_ENTRIES) if folder.is_dir() else None
    if stranger is not None:
        raise PluginBuildError(f"--out {folder} holds {stranger.relative_to(folder)}, which no plugin build wrote (a "
                               "build there removes an earlier build's files); choose a new or empty folder")


def _stranger(folder: Path, ours: tuple[str, ...]) -> Path | None:
    """The first entry of ``folder`` no build wrote: not one of ``ours`` nor a killed write's temporary of one, nor
    (in the build folder) a ``tensorrt-*`` folder holding only its own."""
    for entry in sorted(folder.iterdir()):
        if ours is _BUILD_ENTRIES and entry.name.startswith(TENSORRT_DIR_PREFIX) and entry.is_dir() \
                and not entry.is_symlink():
            if (inner := _stranger(entry, _TENSORRT_ENTRIES)) is not None:
                return inner
        elif entry.name not in ours and not any(entry.name.startswith(f".{name}.") for name in ours):
            return entry
    return None


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s build lock: two builds into one folder (one CMake tree) run one after the other."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_plugins(
    out_dir: str | os.PathLike[str] | None = None,
    tensorrt_root: str | os.PathLike[str] | None = None,
    cuda_archs: str | Sequence[str] | None = None,
    kernels_only: bool = False,
    jobs: int = 2,
    status: Callable[[str], None] = _quiet,
    tensorrt_lib: str | os.PathLike[str] | None = None,
) -> BuildResult:
    """Configure and build the libraries, or return the cached build of the same sources and options.

    The kernels library is built once per sources, architectures and nvcc, in ``out_dir`` or
    ``default_cache_dir()/<kernels_key>``, and every mode uses it: the TensorRT libraries are linked in the
    same CMake tree from the same kernel objects, into ``tensorrt-<tensorrt_key>/lib`` inside that folder.
    ``tensorrt_root``: TensorRT folder with include/NvInfer.h (else ``$TENSORRT_ROOT``, else the system include
    folders). ``tensorrt_lib``: the folder holding libnvinfer (libnvinfer.so or pip's libnvinfer.so.<major>), else
    TENSORRT_ROOT/lib(64), pip's tensorrt*_libs and the system library folders are searched.
    ``cuda_archs``: numbers such as "80;90" or a preset ("edge" = Jetson Orin 87 + Thor 110); the default
    80-real;86-real;89-real;90 = A100/A10/L4/H100 SASS plus PTX of 90. Below 80 (T4, Xavier) is refused.
    ``status`` gets a line per step, per compiled file and architecture, per linked library.

    Without TensorRT headers or libnvinfer the kernels are still built, the TensorRT libraries are not, and the
    result says so: ``outcomes`` (per library: built, cached or skipped, and why) and ``not_built`` (one line
    with the fix). That is known before anything compiles and reported through ``status`` at once. Bad options
    and compiler errors raise PluginBuildError.
    """
    if out_dir is not None:
        _refuse_foreign_folder(Path(out_dir))
    cmake = find_cmake()
    nvcc = find_nvcc()
    nvcc_text = nvcc_version(nvcc)
    archs = normalize_archs(cuda_archs, nvcc_gpu_archs(nvcc))
    trt = None if kernels_only else tensorrt_inputs(tensorrt_root, tensorrt_lib)
    key = kernels_key(archs, nvcc, nvcc_version=nvcc_text, generator=os.environ.get("CMAKE_GENERATOR"))
    tree = _Tree(Path(out_dir) if out_dir else default_cache_dir() / key, key, cmake, nvcc, nvcc_text, archs, jobs,
                 status)
    with _locked(tree.folder):
        kernels = _load_info(tree.folder, key)
        if kernels is None:
            tree.reset()
        else:
            status(f"kernels: cached {kernels.kernels}")
        skip = _skip_before_cmake(trt)
        tensorrt = None
        if skip is None and trt is not None:
            built = _build_tensorrt(tree, kernels, trt)
            if isinstance(built, _Skip):
                skip = built
            else:
                kernels, tensorrt = built
        if skip is not None and skip.line is not None:
            status(f"TensorRT libraries will not be built ({skip.why}); building the kernels only")
        if kernels is None:
            kernels = tree.build_kernels()
        return _result(kernels, tensorrt, skip)


def _skip_before_cmake(trt: TensorrtInputs | None) -> _Skip | None:
    """Why the TensorRT libraries are skipped, where that is known before CMake runs (None: try to build them)."""
    if trt is None:
        return _Skip("--kernels-only", None)
    if trt.include is not None:
        return None
    where = f"TENSORRT_ROOT={trt.root}" if trt.root else "TENSORRT_ROOT (unset)"
    return _Skip("no TensorRT headers (NvInfer.h) found",
                 f"the TensorRT plugin libraries were not built: no NvInfer.h under {where} or the system include "
                 "folders; pass --tensorrt-root DIR (a TensorRT folder with include/NvInfer.h) or set TENSORRT_ROOT, "
                 "or build only the kernels with --kernels-only")


def _build_tensorrt(tree: _Tree, kernels: BuildResult | None,
                    trt: TensorrtInputs) -> tuple[BuildResult, BuildResult] | _Skip:
    """(kernels, TensorRT libraries), the kernels compiled in the same ``cmake --build`` when ``kernels`` is None,
    or those already built for this TensorRT; a _Skip when CMake finds no usable libnvinfer."""
    key = tensorrt_key(tree.key, trt.root, tensorrt_include=str(trt.include), tensorrt_header=trt.header,
                       tensorrt_lib=trt.lib_dir, tensorrt_lib_hints=trt.lib_hints)
    trt_folder = tree.folder / f"{TENSORRT_DIR_PREFIX}{key}"
    cached = _load_info(trt_folder, key) if kernels is not None else None
    if kernels is not None and cached is not None:
        tree.status(f"TensorRT libraries: cached in {trt_folder / 'lib'}")
        return kernels, cached
    tree.status(f"TensorRT libraries: configuring (headers {trt.version or 'of unknown version'} in {trt.include})")
    code, output = tree.configure(trt)
    if code != 0:
        known = _explain_configure(output, trt.major)
        if known is None:
            raise _failed("cmake configure", code, "check the CUDA toolkit and CMake versions", tree.log)
        return _Skip(known.why, f"{known.line} (log: {tree.log})")
    tree.status(f"compiling {'the kernels for ' + tree.archs + ', then ' if kernels is None else ''}"
                "the TensorRT plugins")
    tree.compile([*([] if kernels is not None else [KERNELS_TARGET]), *TENSORRT_TARGETS])
    kernels = kernels or tree.record_kernels()
    return kernels, tree.record_tensorrt(trt_folder, key, kernels.kernels, output)


def _result(kernels: BuildResult, tensorrt: BuildResult | None, skip: _Skip | None) -> BuildResult:
    """The TensorRT result (else the kernels'), with the outcome of each library and why any was skipped."""
    result = tensorrt or kernels

    def outcome(name: str, file: str, path: Path | None, cached: bool) -> LibraryOutcome:
        if path is None:
            return LibraryOutcome(name, file, None, SKIPPED, skip.why if skip else "")
        return LibraryOutcome(name, file, path, CACHED if cached else BUILT)

    outcomes = (outcome("kernels", KERNELS_LIB, kernels.kernels, kernels.cached),
                outcome("trt", TRT_LIB, result.trt, result.cached),
                outcome("trt_dyn", TRT_DYN_LIB, result.trt_dyn, result.cached))
    return replace(result, cached=kernels.cached and result.cached, outcomes=outcomes,
                   not_built=skip.line if skip else None)


def find_libraries(cache_dir: str | os.PathLike[str] | None = None, tensorrt_major: int | None = None,
                   with_tensorrt: bool = False) -> BuildResult | None:
    """The most recent complete build in the cache, or None when nothing has been built.

    ``with_tensorrt``: the most recent build that has the TensorRT libraries (a later kernels-only build does not
    hide it). ``tensorrt_major``: the most recent build whose TensorRT libraries were compiled against headers
    of that major version (the plugin ABI changes between majors).
    """
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    if not root.is_dir():
        return None
    found = [*root.glob(f"*/{INFO_FILE}"), *root.glob(f"*/{TENSORRT_DIR_PREFIX}*/{INFO_FILE}")]
    for info in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True):
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
