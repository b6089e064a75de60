"""Triton itself reads what ``attnres triton-repo`` writes: PyTriton's bundled ``tritonserver`` (which has only
the Python backend) loads the repository and gets past its own config validation for both models, failing only
where the onnxruntime and tensorrt backends, absent here, would take over."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from attnres_export.serve.repository import RepoOptions, write_repository
from tests.serve.conftest import NEEDS_SERVER

pytestmark = NEEDS_SERVER


def tritonserver() -> Path:
    spec = importlib.util.find_spec("pytriton")
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    if not (root / "bin" / "tritonserver").is_file():
        pytest.skip("this nvidia-pytriton ships no tritonserver binary")
    return root


def test_the_bundled_triton_validates_both_configs_and_stops_only_at_the_missing_backends(
        fake_engine, portable_onnx, tmp_path):
    repo = tmp_path / "repo"
    write_repository(RepoOptions(portable_onnx, repo, "ort", instances=2))
    write_repository(RepoOptions(fake_engine, repo, "trt", cuda_graphs=True))
    root = tritonserver()
    result = subprocess.run(
        [str(root / "bin" / "tritonserver"), f"--model-repository={repo}", f"--backend-directory={root / 'backends'}",
         "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false", "--disable-auto-complete-config",
         "--exit-timeout-secs=1"], capture_output=True, text=True, timeout=60)
    log = result.stdout + result.stderr
    errors = [line for line in log.splitlines() if line.startswith("E") and "failed to load" in line]
    assert result.returncode != 0 and len(errors) == 2, log[-3000:]
    assert any("'ort'" in e and "unable to find backend library for backend 'onnxruntime'" in e for e in errors), log
    assert any("'trt'" in e and "unable to find backend library for backend 'tensorrt'" in e for e in errors), log
    assert "Poll failed" not in log and "must specify" not in log
