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
from attnres_export.plugins import build, toolchain

NVCC = shutil.which("nvcc") or next((p for p in toolchain.NVCC_FALLBACKS if Path(p).is_file()), None)


def _copy_sources(tmp_path: Path) -> Path:
    dst = tmp_path / "src"
    shutil.copytree(build.SOURCE_DIR, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_kernels_key_changes_with_a_source_or_option_but_not_with_the_build_mode(tmp_path: Path) -> None:
    """One key for the kernels whatever is built on top of them; any source, the archs or nvcc make another."""
    src = _copy_sources(tmp_path)
    base = build.kernels_key("90", "nvcc", source_dir=src)
    assert base == build.kernels_key("90", "nvcc", source_dir=src)
    assert base != build.kernels_key("80;90", "nvcc", source_dir=src)
    assert base != build.kernels_key("90", "/other/nvcc", source_dir=src)
    assert base != build.kernels_key("90", "nvcc", source_dir=src, generator="Ninja")
    kernel = src / "attnResAggregatePlugin" / "attnResAggregateKernel.cu"
    kernel.write_text(kernel.read_text() + "\n")
    changed = build.kernels_key("90", "nvcc", source_dir=src)
    assert base != changed
    norm = src / "attnResAggregateNormPlugin" / "attnResAggregateNormKernel.cu"
    norm.write_text(norm.read_text() + "\n")
    assert changed != build.kernels_key("90", "nvcc", source_dir=src)


def test_tensorrt_key_changes_with_the_kernels_and_each_tensorrt_input() -> None:
    base = build.tensorrt_key("k1", "/trt", tensorrt_include="/trt/include", tensorrt_header="#define A 10")
    assert base == build.tensorrt_key("k1", "/trt", tensorrt_include="/trt/include", tensorrt_header="#define A 10")
    for other in (build.tensorrt_key("k2", "/trt", tensorrt_include="/trt/include", tensorrt_header="#define A 10"),
                  build.tensorrt_key("k1", "/trt2", tensorrt_include="/trt/include", tensorrt_header="#define A 10"),
                  build.tensorrt_key("k1", "/trt", tensorrt_include="/trt/include", tensorrt_header="#define A 11"),
                  build.tensorrt_key("k1", "/trt", tensorrt_include="/trt/include", tensorrt_header="#define A 10",
                                     tensorrt_lib="/pip/tensorrt_libs"),
                  build.tensorrt_key("k1", "/trt", tensorrt_include="/trt/include", tensorrt_header="#define A 10",
                                     tensorrt_lib_hints=["/pip/tensorrt_libs"])):
        assert other != base


def test_missing_cmake_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda name, path=None: None)
    with pytest.raises(PluginBuildError, match="cmake not found: install CMake"):
        build.build_plugins(kernels_only=True)


def test_missing_nvcc_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDACXX", raising=False)
    monkeypatch.setattr(build.shutil, "which", lambda name, path=None: "/usr/bin/cmake" if name == "cmake" else None)
    monkeypatch.setattr(toolchain, "NVCC_FALLBACKS", ())
    with pytest.raises(PluginBuildError, match="nvcc not found: install the CUDA toolkit or set CUDACXX"):
        build.build_plugins(kernels_only=True)


def test_bad_arch_list_is_rejected() -> None:
    assert toolchain.normalize_archs("80, 86;90") == "80;86;90"
    assert toolchain.normalize_archs(None) == toolchain.DEFAULT_CUDA_ARCHS
    with pytest.raises(PluginBuildError, match="bad CUDA architecture"):
        toolchain.normalize_archs("sm_90")


def test_tensorrt_root_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENSORRT_ROOT", raising=False)
    include = tmp_path / "TensorRT-11.1" / "include"
    include.mkdir(parents=True)
    (include / "NvInfer.h").write_text("// fake\n")
    (include / "NvInferVersion.h").write_text(
        "#define TRT_MAJOR_ENTERPRISE 11\n#define TRT_MINOR_ENTERPRISE 1\n#define TRT_PATCH_ENTERPRISE 0\n"
    )
    assert toolchain.find_tensorrt_include(include.parent) == include.resolve()
    assert toolchain.tensorrt_version(include) == "11.1.0"
    monkeypatch.setenv("TENSORRT_ROOT", str(include.parent))
    assert toolchain.find_tensorrt_include() == include.resolve()
    assert toolchain.find_tensorrt_include(tmp_path / "missing") == include.resolve()


def test_cli_path_with_nothing_built_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNRES_PLUGIN_CACHE", str(tmp_path / "empty"))
    result = CliRunner().invoke(plugin_app, ["path"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1
    assert "run `attnres plugin build`" in lines[0]
    assert "Traceback" not in result.output


def test_cli_build_error_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda name, path=None: None)
    result = CliRunner().invoke(plugin_app, ["build", "--kernels-only", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert [line for line in result.output.splitlines() if line.strip()] == [
        line for line in result.output.splitlines() if "cmake not found" in line
    ]


def _fake_result(folder: Path, not_built: str | None) -> build.BuildResult:
    """What build_plugins returns when the kernels were built and the TensorRT libraries skipped."""
    kernels = folder / "lib" / build.KERNELS_LIB
    why = "no TensorRT headers (NvInfer.h) found"
    outcomes = (build.LibraryOutcome("kernels", build.KERNELS_LIB, kernels, build.BUILT),
                build.LibraryOutcome("trt", build.TRT_LIB, None, build.SKIPPED, why),
                build.LibraryOutcome("trt_dyn", build.TRT_DYN_LIB, None, build.SKIPPED, why))
    return build.BuildResult(out_dir=folder, kernels=kernels, trt=None, trt_dyn=None, tensorrt_include=None,
                             tensorrt_version=None, cuda_archs="90", cached=False, log=folder / build.LOG_FILE,
                             outcomes=outcomes, not_built=not_built)


@pytest.mark.parametrize("not_built", [None, "the TensorRT plugin libraries were not built: pass --tensorrt-root"])
def test_cli_build_prints_progress_then_a_table_and_exits_1_only_when_something_asked_for_was_not_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, not_built: str | None) -> None:
    def fake_build(**options) -> build.BuildResult:
        options["status"]("kernels: attnResAggregateKernel.cu for sm_90 (architecture 1 of 1)")
        return _fake_result(tmp_path, not_built)

    monkeypatch.setattr(build, "build_plugins", fake_build)
    result = CliRunner().invoke(plugin_app, ["build", "--cuda-arch", "90", "--out", str(tmp_path)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[0] == "0:00 kernels: attnResAggregateKernel.cu for sm_90 (architecture 1 of 1)"
    rows = {line.strip("│ ").split()[0]: line for line in lines if line.strip("│ ").startswith("libattnres")}
    assert "built" in rows["libattnres_kernels.so"] and str(tmp_path / "lib") in rows["libattnres_kernels.so"]
    for skipped in ("libattnres_trt.so", "libattnres_trt_dyn.so"):
        assert "skipped" in rows[skipped] and "no TensorRT headers (NvInfer.h) found" in rows[skipped]
    if not_built is None:
        assert result.exit_code == 0 and "error" not in result.output
    else:
        assert result.exit_code == 1 and lines[-1] == f"error: {not_built}"


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
    assert info["cuda_archs"] == toolchain.normalize_archs("edge") and info["cuda_archs"].startswith("87-real")
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


def test_a_folder_reused_for_another_key_forgets_what_cmake_found_and_the_old_tensorrt_libraries(
        tmp_path: Path) -> None:
    """--out reused with other archs (or a folder of the older flat layout): the next build starts over."""
    for stale in ("build/CMakeCache.txt", build.INFO_FILE, "tensorrt-old/lib/libattnres_trt.so",
                  f"lib/{build.TRT_LIB}", f"lib/{build.TRT_DYN_LIB}", build.LOG_FILE):
        (tmp_path / stale).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / stale).write_text("old")
    tree = build._Tree(tmp_path, "new-key", "cmake", "nvcc", "", "90", 1, lambda _line: None)
    tree.reset()
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [build.LOG_FILE]
    assert (tmp_path / build.LOG_FILE).read_text() == "" and (tmp_path / "build").is_dir()
