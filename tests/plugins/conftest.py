"""The one kernels build the slow plugin tests share, as ``attnres plugin build`` shares it between its modes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnres_export.plugins import build, toolchain

NVCC = shutil.which("nvcc") or next((p for p in toolchain.NVCC_FALLBACKS if Path(p).is_file()), None)


@pytest.fixture(scope="session")
def kernels_80(tmp_path_factory: pytest.TempPathFactory) -> build.BuildResult:
    """libattnres_kernels.so for 80-real, compiled once per session (~1 min on 2 cores). The tests that build the
    TensorRT libraries, or find them impossible, build into this folder and reuse these kernels."""
    if NVCC is None or shutil.which("cmake") is None:
        pytest.skip("nvcc and cmake are needed to compile the kernels")
    return build.build_plugins(out_dir=tmp_path_factory.mktemp("kernels-80"), cuda_archs="80-real", kernels_only=True)
