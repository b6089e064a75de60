"""The TensorRT plugin libraries against a stand-in libnvinfer: loading, registration and every plugin method.

Needs TensorRT *headers* only (``TENSORRT_ROOT`` with include/NvInfer.h, e.g. NVIDIA/TensorRT's include/),
nvcc, cmake and a C++ compiler; no GPU and no TensorRT runtime. The harness (tests/plugins/harness/) builds a
stand-in ``libnvinfer.so.<major>`` (only the versioned name, as pip ships it), the plugin libraries are built
against it through ``build_plugins(tensorrt_lib=...)``, and ``plugin_harness`` loads each library as TensorRT
does and drives every plugin through the public interfaces of those headers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from attnres_export.plugins import build, toolchain

HARNESS_DIR = Path(__file__).resolve().parent / "harness"
REPO_ROOT = Path(__file__).resolve().parents[2]
TENSORRT_ROOT = os.environ.get("TENSORRT_ROOT")
HAVE_HEADERS = bool(TENSORRT_ROOT) and (Path(TENSORRT_ROOT) / "include" / "NvInfer.h").is_file()
NVCC = shutil.which("nvcc") or next((p for p in toolchain.NVCC_FALLBACKS if Path(p).is_file()), None)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not HAVE_HEADERS, reason="TensorRT headers not found (set TENSORRT_ROOT to a folder with include/NvInfer.h)"
    ),
]

PLUGIN_CASES = 13
"""Node cases the harness runs: AttnResAggregate with 1, 3 and 256 sources; AttnResAggregateNorm with 1, 3 and 256
sources, each with has_aggregate 0 and 1; ResidualScoreAttention with 3..5 inputs."""

PLUGINS = 3
"""Creators in the one list: AttnResAggregate, AttnResAggregateNorm, ResidualScoreAttention."""

CREATE_REFUSALS = 17
"""createPlugin refusals: 4 AttnResAggregate, 9 AttnResAggregateNorm, 4 ResidualScoreAttention."""

CONFIGURE_REFUSALS = 13
"""configurePlugin refusals: 3 AttnResAggregate, 6 AttnResAggregateNorm, 4 ResidualScoreAttention."""


@dataclass(frozen=True)
class Built:
    harness: Path
    standin: Path
    libs: build.BuildResult
    major: int
    seconds: float


def _headers_version() -> str:
    version = toolchain.tensorrt_version(Path(TENSORRT_ROOT or ".") / "include")
    assert version is not None, f"no version in {TENSORRT_ROOT}/include/NvInferVersion.h"
    return version


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, kernels_80: build.BuildResult) -> Built:
    if NVCC is None or shutil.which("cmake") is None or shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("nvcc, cmake and a C++ compiler are needed to build the plugins and the harness")
    root = tmp_path_factory.mktemp("harness")
    cmake = shutil.which("cmake") or "cmake"
    harness_build = root / "harness"
    started = time.perf_counter()
    env = {**os.environ, "CUDACXX": os.environ.get("CUDACXX", NVCC)}
    for command in (
        [cmake, "-S", str(HARNESS_DIR), "-B", str(harness_build), f"-DTENSORRT_ROOT={TENSORRT_ROOT}",
         f"-DCUDAToolkit_ROOT={Path(os.path.realpath(NVCC)).parent.parent}"],
        [cmake, "--build", str(harness_build), "--parallel", "2"],
    ):
        proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        assert proc.returncode == 0, f"{' '.join(command)} failed:\n{proc.stdout}\n{proc.stderr}"
    major = toolchain.major_of(_headers_version())
    assert major is not None
    standin = harness_build / "standin"
    assert (standin / f"libnvinfer.so.{major}").is_file()
    assert not (standin / "libnvinfer.so").exists(), "the stand-in must have only the versioned name, like pip"
    libs = build.build_plugins(
        out_dir=kernels_80.out_dir, tensorrt_root=TENSORRT_ROOT, tensorrt_lib=standin, cuda_archs="80-real"
    )
    seconds = time.perf_counter() - started
    print(f"\nTensorRT headers {libs.tensorrt_version}: harness and plugins built in {seconds:.0f}s (kernels reused)")
    return Built(harness_build / "plugin_harness", standin, libs, major, seconds)


def _run_harness(built: Built, mode: str, library: Path) -> list[str]:
    proc = subprocess.run(
        [str(built.harness), mode, str(library)], capture_output=True, text=True, timeout=600, check=False
    )
    lines = proc.stdout.splitlines()
    failures = [line for line in lines if line.startswith("FAIL")]
    assert proc.returncode == 0 and not failures, "\n".join(failures or lines[-20:]) + proc.stderr
    summary = re.fullmatch(r"SUMMARY passed=(\d+) failed=(\d+) skipped=(\d+)", lines[-1])
    assert summary is not None and summary.group(2) == "0", lines[-1]
    print(f"\n{mode}: {lines[0]}\n{mode}: {lines[-1]}")
    return lines


def _count(lines: list[str], text: str, prefix: str = "PASS") -> int:
    return sum(1 for line in lines if line.startswith(prefix) and text in line)


def _assert_every_plugin_checked(lines: list[str]) -> None:
    assert _count(lines, f"{PLUGINS} creators registered") == 1
    assert _count(lines, 'namespace argument "attnres" equals the creator\'s namespace') == PLUGINS
    assert _count(lines, 'registry getCreator(name, "1", "attnres") finds the creator') == PLUGINS
    assert _count(lines, "createPlugin refuses") == CREATE_REFUSALS
    for check in (
        "createPlugin(kBUILD) from the node's attributes",
        "interface kinds PLUGIN_V3ONE_CORE / BUILD (v1) / RUNTIME",
        "getOutputShapes = ",
        "linear combinations",
        "supportsFormatCombination reads no position after pos",
        "configurePlugin with dynamic extents",
        "deserialized plugin serializes the same fields",
        "clone keeps the fields after the original is deleted",
        "enqueue before onShapeChange fails with a logged error",
        "attachToContext returns a new plugin",
        "onShapeChange with the run-time shapes",
        "enqueue with null buffers fails with a logged error",
        "getWorkspaceSize = ",
    ):
        assert _count(lines, check) == PLUGIN_CASES, check
    without_gpu = _count(lines, "enqueue without a GPU") + _count(lines, "enqueue without a GPU", "SKIP")
    assert without_gpu == PLUGIN_CASES
    assert _count(lines, "configurePlugin refuses it with a logged error") == CONFIGURE_REFUSALS


def _assert_aggregate_norm_checked(lines: list[str]) -> None:
    """Both output counts of AttnResAggregateNorm, with h in the workspace (B=2 x T=5 x 64 float32) or an output."""
    for sources in (1, 3, 256):
        without, with_h = (f"AttnResAggregateNorm [{sources} sources, has_aggregate={h}]" for h in (0, 1))
        assert _count(lines, f"{without}: getNbOutputs = 1") == 1
        assert _count(lines, f"{without}: getWorkspaceSize = {2 * 5 * 64 * 4}") == 1
        assert _count(lines, f"{with_h}: getNbOutputs = 2") == 1
        assert _count(lines, f"{with_h}: getWorkspaceSize = 0") == 1
        assert _count(lines, f"{with_h}: getOutputShapes = [B,T,64] [B,T,64]") == 1
    for refusal in ("has_aggregate = 2", "norm_eps negative", "norm_eps missing"):
        assert _count(lines, f"AttnResAggregateNorm: createPlugin refuses {refusal}") == 1
    for bad in ("norm_weight not [D]", "no source", "h listed without has_aggregate"):
        assert _count(lines, f"AttnResAggregateNorm [{bad}]: configurePlugin refuses it") == 1


def test_tensorrt_libraries_reuse_the_kernels_build(built: Built, kernels_80: build.BuildResult) -> None:
    """One kernels build for both modes: the TensorRT build found the kernels-only build's library (same key,
    same folder, not compiled again) and put its libraries in a tensorrt-<key> folder beside it."""
    states = {o.name: o.state for o in built.libs.outcomes}
    assert states == {"kernels": build.CACHED, "trt": build.BUILT, "trt_dyn": build.BUILT}
    assert built.libs.kernels == kernels_80.kernels
    for library in (built.libs.trt, built.libs.trt_dyn):
        assert library is not None and library.parent.parent.parent == kernels_80.out_dir
        assert library.parent.parent.name.startswith(build.TENSORRT_DIR_PREFIX)
    assert not (kernels_80.out_dir / "lib" / build.TRT_LIB).exists(), "moved out of the shared lib/"
    assert build.recorded_tensorrt_version(built.libs.trt) == _headers_version()


def test_a_second_build_in_either_mode_compiles_nothing(built: Built, kernels_80: build.BuildResult) -> None:
    lines: list[str] = []
    again = build.build_plugins(out_dir=kernels_80.out_dir, tensorrt_root=TENSORRT_ROOT, tensorrt_lib=built.standin,
                                cuda_archs="80-real", status=lines.append)
    assert again.cached and again.trt == built.libs.trt and again.not_built is None
    assert {o.state for o in again.outcomes} == {build.CACHED}
    kernels_only = build.build_plugins(out_dir=kernels_80.out_dir, cuda_archs="80-real", kernels_only=True,
                                       status=lines.append)
    assert kernels_only.cached and kernels_only.kernels == kernels_80.kernels
    assert not any("compiling" in line or "configuring" in line for line in lines), lines


def test_static_library_through_the_harness(built: Built) -> None:
    assert built.libs.trt is not None
    lines = _run_harness(built, "static", built.libs.trt)
    _assert_every_plugin_checked(lines)
    _assert_aggregate_norm_checked(lines)
    assert _count(lines, "dlopen(RTLD_LAZY | RTLD_LOCAL) loads it") == 1
    assert _count(lines, "errors were logged through getLogger()") == 1


def test_dynamic_library_through_the_harness(built: Built) -> None:
    assert built.libs.trt_dyn is not None
    lines = _run_harness(built, "dynamic", built.libs.trt_dyn)
    _assert_every_plugin_checked(lines)
    _assert_aggregate_norm_checked(lines)
    assert _count(lines, "IPluginRegistry::loadLibrary loads it") == 1
    assert _count(lines, "loadLibrary handed setLoggerFinder a logger finder") == 1
    assert _count(lines, "errors were logged through the logger finder only") == 1


def _dynamic_symbols(library: Path, *flags: str) -> set[str]:
    out = subprocess.run(["nm", "-D", *flags, str(library)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def _needed(library: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def _tensorrt_imports(library: Path) -> set[str]:
    """Undefined symbols that no system library versions (getPluginRegistry, getLogger, ...)."""
    out = subprocess.run(["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True, check=True)
    return {
        line.split()[-1]
        for line in out.stdout.splitlines()
        if line.split() and line.split()[0] == "U" and "@" not in line.split()[-1]
    }


@pytest.mark.skipif(shutil.which("nm") is None or shutil.which("readelf") is None, reason="binutils not found")
def test_symbols_and_libnvinfer_dependency(built: Built) -> None:
    trt, dyn = built.libs.trt, built.libs.trt_dyn
    assert trt is not None and dyn is not None
    assert _tensorrt_imports(trt) == {"getPluginRegistry", "getLogger"}
    assert _tensorrt_imports(dyn) == set(), "the _dyn library must import no TensorRT symbol (logger finder only)"
    assert f"libnvinfer.so.{built.major}" in _needed(trt), "libattnres_trt.so must link libnvinfer"
    assert not any(n.startswith("libnvinfer") for n in _needed(dyn)), "_dyn needs nothing of libnvinfer"
    assert {"getCreators", "setLoggerFinder"} <= _dynamic_symbols(dyn, "--defined-only")
    assert "getCreators" not in _dynamic_symbols(trt, "--defined-only")


def test_build_info_records_header_and_nvcc_versions(built: Built) -> None:
    info = json.loads((built.libs.out_dir / build.INFO_FILE).read_text())
    assert info["tensorrt_version"] == _headers_version()
    assert re.search(r"release \d+\.\d+", info["nvcc_version"])
    assert Path(info["nvinfer"]).name == f"libnvinfer.so.{built.major}"
    assert Path(info["nvinfer"]).parent.resolve() == built.standin.resolve()


LOAD_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, os, sys, types
    from attnres_export.backends.tensorrt import plugin_library
    from attnres_export.errors import EngineError

    standin_path, library, promote = sys.argv[1], sys.argv[2], sys.argv[3] == "promote"
    # libnvinfer opened the way pip's tensorrt_libs opens it: ctypes.CDLL, i.e. RTLD_LOCAL.
    standin = ctypes.CDLL(standin_path, mode=os.RTLD_LOCAL)
    standin.attnresStandinLoadLibrary.restype = ctypes.c_void_p
    standin.attnresStandinLoadLibrary.argtypes = [ctypes.c_char_p]
    if not promote:
        plugin_library.NVINFER_NAMES = ()
    registry = types.SimpleNamespace(load_library=lambda p: standin.attnresStandinLoadLibrary(p.encode()) or None)
    trt = types.SimpleNamespace(__version__="0", get_plugin_registry=lambda: registry)
    result = {}
    try:
        plugin_library.load(trt, library)
        plugin_library.load(trt, library)  # again: a no-op
        result["loaded"] = True
    except EngineError as exc:
        result["loaded"] = False
        result["error"] = str(exc)
    result["registrations"] = standin.attnresStandinRegistrations()
    result["refused"] = standin.attnresStandinRefusedRegistrations()
    print(json.dumps(result))
    """
)


def _load_in_fresh_python(built: Built, library: Path, promote: bool) -> dict:
    standin = built.standin / f"libnvinfer.so.{built.major}"
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_SCRIPT, str(standin), str(library), "promote" if promote else "no-promote"],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("promote", [True, False], ids=["with-promotion", "without-promotion"])
def test_static_library_loads_when_libnvinfer_is_rtld_local(built: Built, promote: bool) -> None:
    """The link fix: libattnres_trt.so needs libnvinfer.so.<major>, so it loads even with no global libnvinfer."""
    assert built.libs.trt is not None
    result = _load_in_fresh_python(built, built.libs.trt, promote)
    assert result == {"loaded": True, "registrations": PLUGINS, "refused": 0}


def test_dynamic_library_loads_twice_in_one_process(built: Built) -> None:
    """B12: the second plugin_library.load of the _dyn library is a no-op, not a failed loadLibrary."""
    assert built.libs.trt_dyn is not None
    result = _load_in_fresh_python(built, built.libs.trt_dyn, promote=True)
    assert result == {"loaded": True, "registrations": PLUGINS, "refused": 0}


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler")
def test_promotion_lets_an_unlinked_library_load(built: Built, tmp_path: Path) -> None:
    """What the RTLD_NOLOAD | RTLD_GLOBAL promotion buys: a library that imports getPluginRegistry without
    linking libnvinfer (as the TensorRT libraries were before the link fix) loads only with it."""
    source = tmp_path / "probe.cpp"
    source.write_text('extern "C" void* getPluginRegistry() noexcept;\n'
                      'extern "C" void* attnresProbe() { return getPluginRegistry(); }\n')
    probe = tmp_path / "libattnres_probe.so"
    compiler = shutil.which(os.environ.get("CXX", "c++")) or "c++"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(probe), str(source)], check=True)
    assert not any(n.startswith("libnvinfer") for n in _needed(probe))
    without = _load_in_fresh_python(built, probe, promote=False)
    assert without["loaded"] is False and "undefined symbol: getPluginRegistry" in without["error"]
    assert len(without["error"].splitlines()) == 1
    assert _load_in_fresh_python(built, probe, promote=True)["loaded"] is True
