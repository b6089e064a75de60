"""Build driver, CLI and kernel library tests; the kernel build needs nvcc, nothing here needs a GPU."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnres_export.cli.framework import plugin_app
from attnres_export.errors import PluginBuildError
from attnres_export.plugins import build

NVCC = shutil.which("nvcc") or next((p for p in build.NVCC_FALLBACKS if Path(p).is_file()), None)


def _copy_sources(tmp_path: Path) -> Path:
    dst = tmp_path / "src"
    shutil.copytree(build.SOURCE_DIR, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_hash_changes_when_a_source_or_option_changes(tmp_path: Path) -> None:
    src = _copy_sources(tmp_path)
    base = build.build_hash(None, "90", True, "nvcc", source_dir=src)
    assert base == build.build_hash(None, "90", True, "nvcc", source_dir=src)
    assert base != build.build_hash(None, "80;90", True, "nvcc", source_dir=src)
    assert base != build.build_hash(None, "90", False, "nvcc", source_dir=src)
    kernel = src / "attnResAggregatePlugin" / "attnResAggregateKernel.cu"
    kernel.write_text(kernel.read_text() + "\n")
    changed = build.build_hash(None, "90", True, "nvcc", source_dir=src)
    assert base != changed
    norm = src / "attnResAggregateNormPlugin" / "attnResAggregateNormKernel.cu"
    norm.write_text(norm.read_text() + "\n")
    assert changed != build.build_hash(None, "90", True, "nvcc", source_dir=src)


def test_missing_cmake_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(PluginBuildError, match="cmake not found: install CMake"):
        build.build_plugins(kernels_only=True)


def test_missing_nvcc_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDACXX", raising=False)
    monkeypatch.setattr(build.shutil, "which", lambda name: "/usr/bin/cmake" if name == "cmake" else None)
    monkeypatch.setattr(build, "NVCC_FALLBACKS", ())
    with pytest.raises(PluginBuildError, match="nvcc not found: install the CUDA toolkit or set CUDACXX"):
        build.build_plugins(kernels_only=True)


def test_bad_arch_list_is_rejected() -> None:
    assert build.normalize_archs("80, 86;90") == "80;86;90"
    assert build.normalize_archs(None) == build.DEFAULT_CUDA_ARCHS
    with pytest.raises(PluginBuildError, match="bad CUDA architecture"):
        build.normalize_archs("sm_90")


def test_tensorrt_root_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENSORRT_ROOT", raising=False)
    include = tmp_path / "TensorRT-11.1" / "include"
    include.mkdir(parents=True)
    (include / "NvInfer.h").write_text("// fake\n")
    (include / "NvInferVersion.h").write_text(
        "#define TRT_MAJOR_ENTERPRISE 11\n#define TRT_MINOR_ENTERPRISE 1\n#define TRT_PATCH_ENTERPRISE 0\n"
    )
    assert build.find_tensorrt_include(include.parent) == include.resolve()
    assert build.tensorrt_version(include) == "11.1.0"
    monkeypatch.setenv("TENSORRT_ROOT", str(include.parent))
    assert build.find_tensorrt_include() == include.resolve()
    assert build.find_tensorrt_include(tmp_path / "missing") == include.resolve()


def test_cli_path_with_nothing_built_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNRES_PLUGIN_CACHE", str(tmp_path / "empty"))
    result = CliRunner().invoke(plugin_app, ["path"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1
    assert "run `attnres plugin build`" in lines[0]
    assert "Traceback" not in result.output


def test_cli_build_error_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    result = CliRunner().invoke(plugin_app, ["build", "--kernels-only", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert [line for line in result.output.splitlines() if line.strip()] == [
        line for line in result.output.splitlines() if "cmake not found" in line
    ]


@pytest.fixture(scope="module")
def kernels_build(tmp_path_factory: pytest.TempPathFactory) -> build.BuildResult:
    if NVCC is None:
        pytest.skip("nvcc not found (install the CUDA toolkit to compile the kernels)")
    if shutil.which("cmake") is None:
        pytest.skip("cmake not found")
    out = tmp_path_factory.mktemp("kernels")
    return build.build_plugins(out_dir=out, cuda_archs="80-real;86-real;89-real;90", kernels_only=True)


@pytest.mark.slow
def test_kernels_library_builds_for_sm80_to_sm90_and_exports_c_abi(kernels_build: build.BuildResult) -> None:
    lib = kernels_build.kernels
    assert lib.is_file()
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    exported = {line.split()[-1] for line in symbols.stdout.splitlines() if line.strip()}
    assert "attnresAggregateLaunch" in exported
    assert "attnresAggregateNormLaunch" in exported
    assert "residualScoreAttentionLaunch" in exported
    assert not any("residualScoreAttentionKernel" in name for name in exported), "kernels must stay hidden"
    assert not any("aggregateRegisterKernel" in name for name in exported), "kernels must stay hidden"
    assert not any("rmsNormRowsKernel" in name for name in exported), "kernels must stay hidden"
    _assert_cubins(lib, ("sm_80", "sm_86", "sm_89", "sm_90"))


def _assert_cubins(lib: Path, archs: tuple[str, ...]) -> None:
    """Each arch has its SASS in ``lib``, where the toolkit has cuobjdump to list them."""
    cuobjdump = shutil.which("cuobjdump") or str(Path(NVCC or "nvcc").with_name("cuobjdump"))
    if Path(cuobjdump).is_file():
        cubins = subprocess.run([cuobjdump, "--list-elf", str(lib)], capture_output=True, text=True, check=True)
        for arch in archs:
            assert arch in cubins.stdout


@pytest.mark.slow
def test_kernels_library_builds_for_the_edge_preset_jetson_orin_and_thor(tmp_path: Path) -> None:
    if NVCC is None or shutil.which("cmake") is None:
        pytest.skip("nvcc or cmake not found (install the CUDA toolkit and cmake to compile the kernels)")
    result = build.build_plugins(out_dir=tmp_path, cuda_archs="edge", kernels_only=True)
    assert result.kernels.is_file()
    info = json.loads((tmp_path / "build-info.json").read_text())
    assert info["cuda_archs"] == build.normalize_archs("edge") and info["cuda_archs"].startswith("87-real")
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(result.kernels)], capture_output=True, text=True,
                             check=True).stdout
    for launcher in ("attnresAggregateLaunch", "attnresAggregateNormLaunch", "residualScoreAttentionLaunch"):
        assert launcher in symbols
    _assert_cubins(result.kernels, ("sm_87",))


@pytest.mark.slow
def test_cached_build_is_reused(kernels_build: build.BuildResult) -> None:
    again = build.build_plugins(
        out_dir=kernels_build.out_dir, cuda_archs="80-real;86-real;89-real;90", kernels_only=True
    )
    assert again.cached
    assert again.kernels == kernels_build.kernels
