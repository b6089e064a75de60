"""Build options that need no compile: architectures and presets, the cache key, finding libnvinfer."""

from __future__ import annotations

import ctypes.util
import shutil
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from attnres_export.cli.framework import plugin_app
from attnres_export.errors import PluginBuildError
from attnres_export.plugins import build, toolchain

NVCC = shutil.which("nvcc") or next((p for p in toolchain.NVCC_FALLBACKS if Path(p).is_file()), None)
needs_toolchain = pytest.mark.skipif(NVCC is None or shutil.which("cmake") is None, reason="nvcc and cmake needed")


@pytest.mark.parametrize("arch", ["75", "72", "70-real", "61"])
def test_archs_below_80_are_refused_in_one_line_naming_t4_and_xavier(arch: str) -> None:
    with pytest.raises(PluginBuildError, match=r"need sm_80 or newer \(cp\.async\); T4 \(75\), Xavier \(72\)") as e:
        toolchain.normalize_archs(f"80;{arch}")
    assert len(str(e.value).splitlines()) == 1


def test_edge_preset_is_orin_and_thor_under_this_nvcc_number() -> None:
    assert toolchain.normalize_archs("edge") == "87-real;110"
    assert toolchain.normalize_archs("edge", {80, 87, 90, 100, 110, 120}) == "87-real;110"
    assert toolchain.normalize_archs("edge", {80, 87, 90, 100, 101}) == "87-real;101"  # CUDA 12.8-12.9
    assert toolchain.normalize_archs("edge", {80, 86, 87, 89, 90}) == "87-real"  # older nvcc: no Thor
    assert toolchain.normalize_archs("EDGE;90") == "87-real;110;90"
    assert toolchain.normalize_archs("default;edge") == toolchain.DEFAULT_CUDA_ARCHS + ";87-real;110"


def test_default_archs_say_what_they_are() -> None:
    assert toolchain.DEFAULT_CUDA_ARCHS == "80-real;86-real;89-real;90"
    assert "80-real;86-real;89-real;90 = A100/A10/L4/H100 SASS plus PTX of 90" in (build.build_plugins.__doc__ or "")
    assert toolchain.normalize_archs("default") == toolchain.DEFAULT_CUDA_ARCHS


def test_an_arch_this_nvcc_does_not_know_is_refused() -> None:
    with pytest.raises(PluginBuildError, match=r"this nvcc does not support compute_121 \(`nvcc --list-gpu-arch`: "
                                               r"80;90\)"):
        toolchain.normalize_archs("80;121a", {80, 90})
    assert toolchain.normalize_archs("90a;80", {80, 90}) == "90a;80"


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_nvcc_reports_its_version_and_archs() -> None:
    assert NVCC is not None
    text = toolchain.nvcc_version(NVCC)
    assert toolchain.nvcc_release(text) is not None and "release" in (toolchain.nvcc_release(text) or "")
    archs = toolchain.nvcc_gpu_archs(NVCC)
    assert archs is None or 80 in archs


def test_kernels_key_keys_on_the_nvcc_version_not_only_its_path() -> None:
    """A CUDA upgrade in place (same nvcc path, other ``nvcc --version``) is another kernels build."""
    base = build.kernels_key("80", "/usr/bin/nvcc", nvcc_version="release 12.8")
    assert base == build.kernels_key("80", "/usr/bin/nvcc", nvcc_version="release 12.8")
    assert base != build.kernels_key("80", "/usr/bin/nvcc", nvcc_version="release 13.0")


def test_pip_tensorrt_lib_folders_are_found_without_importing_them(tmp_path: Path, monkeypatch) -> None:
    for name in ("tensorrt_libs", "tensorrt_cu13_libs"):
        package = tmp_path / name
        package.mkdir()
        (package / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
        (package / "libnvinfer.so.10").write_bytes(b"")
    (tmp_path / "tensorrt_bindings").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    found = toolchain.pip_tensorrt_lib_dirs()
    assert found == [str(tmp_path / "tensorrt_cu13_libs"), str(tmp_path / "tensorrt_libs")]
    assert "tensorrt_libs" not in sys.modules and "tensorrt_cu13_libs" not in sys.modules


def test_nvinfer_in_accepts_the_pip_versioned_name(tmp_path: Path) -> None:
    assert toolchain.nvinfer_in(tmp_path, 10) is None
    (tmp_path / "libnvinfer.so.10").write_bytes(b"")
    assert toolchain.nvinfer_in(tmp_path, 10) == tmp_path / "libnvinfer.so.10"
    assert toolchain.nvinfer_in(tmp_path, 11) is None
    assert toolchain.nvinfer_in(tmp_path, None) == tmp_path / "libnvinfer.so.10"


def _fake_tensorrt_root(tmp_path: Path, major: int = 99) -> Path:
    include = tmp_path / "trt" / "include"
    include.mkdir(parents=True)
    (include / "NvInfer.h").write_text("// not really\n")
    (include / "NvInferVersion.h").write_text(
        f"#define TRT_MAJOR_ENTERPRISE {major}\n#define TRT_MINOR_ENTERPRISE 0\n#define TRT_PATCH_ENTERPRISE 0\n"
    )
    return include.parent


@needs_toolchain
def test_tensorrt_lib_without_libnvinfer_is_refused_before_building(tmp_path: Path) -> None:
    root = _fake_tensorrt_root(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PluginBuildError, match=r"--tensorrt-lib .*empty holds no libnvinfer\.so or "
                                               r"libnvinfer\.so\.99: pass the folder"):
        build.build_plugins(out_dir=tmp_path / "out", tensorrt_root=root, tensorrt_lib=empty)
    assert not (tmp_path / "out").exists()


@needs_toolchain
def test_tensorrt_root_without_headers_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PluginBuildError, match=r"--tensorrt-root .* has no include/NvInfer\.h"):
        build.build_plugins(out_dir=tmp_path / "out", tensorrt_root=tmp_path)


def _outcomes(result: build.BuildResult) -> list[tuple[str, str, str]]:
    return [(o.name, o.state, o.why) for o in result.outcomes]


def _error_line(output: str) -> str:
    return [line for line in output.splitlines() if line.strip()][-1]


@needs_toolchain
@pytest.mark.skipif(ctypes.util.find_library("nvinfer") is not None, reason="a system libnvinfer is installed")
@pytest.mark.slow
def test_missing_libnvinfer_skips_the_tensorrt_libraries_in_one_line_naming_the_fix(
        kernels_80: build.BuildResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CMake finds headers but no libnvinfer: the kernels (already built: reused, not compiled again) stay, the
    TensorRT libraries are skipped, the reason is one line naming --tensorrt-lib, TENSORRT_ROOT and
    --kernels-only, said through ``status`` before any compile, and the command exits 1 with it."""
    monkeypatch.setattr(toolchain, "pip_tensorrt_lib_dirs", list)
    root = _fake_tensorrt_root(tmp_path)
    lines: list[str] = []
    result = build.build_plugins(out_dir=kernels_80.out_dir, tensorrt_root=root, cuda_archs="80-real",
                                 status=lines.append)
    message = result.not_built or ""
    assert len(message.splitlines()) == 1
    assert message.startswith("libnvinfer (TensorRT 99) not found for the TensorRT libraries: pass --tensorrt-lib DIR")
    assert "TENSORRT_ROOT to a TensorRT folder with lib/" in message and "--kernels-only" in message
    assert result.trt is None and result.kernels == kernels_80.kernels
    assert _outcomes(result) == [("kernels", "cached", ""), ("trt", "skipped", "libnvinfer not found"),
                                 ("trt_dyn", "skipped", "libnvinfer not found")]
    assert "TensorRT libraries will not be built (libnvinfer not found); building the kernels only" in lines
    cli = CliRunner().invoke(plugin_app, ["build", "--tensorrt-root", str(root), "--cuda-arch", "80-real",
                                          "--out", str(kernels_80.out_dir)])
    assert cli.exit_code == 1
    assert _error_line(cli.output).startswith("error: libnvinfer (TensorRT 99) not found")


@needs_toolchain
@pytest.mark.slow
def test_without_tensorrt_headers_the_kernels_are_kept_and_the_command_exits_1_naming_the_fix(
        kernels_80: build.BuildResult, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user trial: no NvInfer.h anywhere. The table says what was built and what was skipped and why, and the
    exit code is 1 with the fix (--tensorrt-root or --kernels-only); --kernels-only itself exits 0."""
    monkeypatch.delenv("TENSORRT_ROOT", raising=False)
    monkeypatch.setattr(toolchain, "find_tensorrt_include", lambda root=None: None)  # hide system headers
    result = build.build_plugins(out_dir=kernels_80.out_dir, cuda_archs="80-real")
    assert (result.not_built or "").startswith("the TensorRT plugin libraries were not built: no NvInfer.h under "
                                               "TENSORRT_ROOT (unset)")
    assert "pass --tensorrt-root DIR" in (result.not_built or "") and "--kernels-only" in (result.not_built or "")
    why = "no TensorRT headers (NvInfer.h) found"
    assert _outcomes(result) == [("kernels", "cached", ""), ("trt", "skipped", why), ("trt_dyn", "skipped", why)]
    args = ["build", "--cuda-arch", "80-real", "--out", str(kernels_80.out_dir)]
    cli = CliRunner().invoke(plugin_app, args)
    assert cli.exit_code == 1
    assert "no TensorRT headers (NvInfer.h) found" in cli.output and str(kernels_80.kernels) in cli.output
    assert _error_line(cli.output).startswith("error: the TensorRT plugin libraries were not built")
    kernels_only = CliRunner().invoke(plugin_app, [*args, "--kernels-only"])
    assert kernels_only.exit_code == 0, kernels_only.output
    assert "(cached)" in kernels_only.output and "error" not in kernels_only.output


def test_cli_build_has_tensorrt_lib_and_explains_the_default_archs() -> None:
    command = typer.main.get_command(plugin_app).commands["build"]  # type: ignore[attr-defined]
    helps = {param.name: getattr(param, "help", "") or "" for param in command.params}
    assert "libnvinfer.so.<major>" in helps["tensorrt_lib"]
    assert "80-real;86-real;89-real;90 = A100/A10/L4/H100 SASS plus PTX of 90" in helps["cuda_arch"]
    assert "edge" in helps["cuda_arch"] and "T4" in helps["cuda_arch"]
    result = CliRunner().invoke(plugin_app, ["build", "--help"])
    assert result.exit_code == 0 and "--tensorrt-lib" in result.output


def test_cli_build_refuses_t4_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(plugin_app, ["build", "--cuda-arch", "75", "--out", str(tmp_path)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    if NVCC is None or shutil.which("cmake") is None:
        pytest.skip("nvcc and cmake needed (the toolchain is checked first)")
    assert result.exit_code == 1 and len(lines) == 1 and "T4 (75)" in lines[0]
