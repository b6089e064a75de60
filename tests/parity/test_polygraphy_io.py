"""Inputs and reference outputs saved for Polygraphy load back with Polygraphy's own loaders, and the replay
`attnres check --save-polygraphy` prints runs in Polygraphy at the check's own bars."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import attnres_export.plugins.build as plugin_build
from attnres_export.cli import app
from attnres_export.graphs.targets import convert
from attnres_export.parity.check import Artifact
from attnres_export.parity.polygraphy_io import replay_runtime, save_polygraphy

polygraphy_json = pytest.importorskip("polygraphy.json", reason="polygraphy (the `test` extra) is not installed")
from polygraphy.comparator import RunResults  # noqa: E402


def sample():
    rng = np.random.default_rng(0)
    inputs = [{"input_ids": rng.integers(0, 9, (2, 4))}, {"input_ids": rng.integers(0, 9, (3, 1))}]
    outputs = [{"logits": rng.standard_normal((2, 4, 9)).astype(np.float32)},
               {"logits": rng.standard_normal((3, 1, 9)).astype(np.float32)}]
    return inputs, outputs


def assert_loads_back(inputs_path, outputs_path, inputs, outputs):
    loaded_inputs = polygraphy_json.load_json(str(inputs_path))
    assert len(loaded_inputs) == len(inputs)
    for got, want in zip(loaded_inputs, inputs, strict=True):
        np.testing.assert_array_equal(got["input_ids"], want["input_ids"])
    results = RunResults.load(str(outputs_path))
    assert list(results.keys()) == ["pytorch-float32"]
    iterations = results["pytorch-float32"]
    for got, want in zip(iterations, outputs, strict=True):
        np.testing.assert_array_equal(got["logits"], want["logits"])


def test_polygraphy_writer_round_trips_through_polygraphy_loaders(tmp_path):
    inputs, outputs = sample()
    paths = save_polygraphy(tmp_path, inputs, outputs, "pytorch-float32")
    assert_loads_back(*paths, inputs, outputs)


def test_own_writer_without_polygraphy_writes_the_same_format(tmp_path, monkeypatch):
    inputs, outputs = sample()
    monkeypatch.setitem(sys.modules, "polygraphy.comparator", None)
    paths = save_polygraphy(tmp_path, inputs, outputs, "pytorch-float32")
    monkeypatch.undo()
    assert_loads_back(*paths, inputs, outputs)


def check_with_replays(artifacts_paths, checkpoint, folder, *extra):
    args = ["check", str(checkpoint), *(a for p in artifacts_paths for a in ("--onnx", str(p))),
            "--save-polygraphy", str(folder), *map(str, extra)]
    return CliRunner().invoke(app, args)


def replay_commands(script: Path) -> list[list[str]]:
    return [shlex.split(line) for line in script.read_text().splitlines() if line.startswith("polygraphy run")]


def option_values(command: list[str], option: str) -> list[str]:
    start = command.index(option) + 1
    values = []
    for token in command[start:]:
        if token.startswith("--"):
            break
        values.append(token)
    return values


def test_check_saves_inputs_reference_outputs_and_one_replay_per_artifact(artifacts, tmp_path, monkeypatch):
    monkeypatch.setattr(plugin_build, "find_libraries", lambda **_: None)
    result = check_with_replays([artifacts.tensorrt, artifacts.portable, artifacts.ort_trt], artifacts.checkpoint,
                                tmp_path / "pg")
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "polygraphy replay of tiny.tensorrt.onnx: no replay yet" in output and "attnres plugin build" in output
    assert "polygraphy replay of tiny.ort-trt.onnx: no replay" in output
    script = tmp_path / "pg" / "tiny.portable.onnx" / "replay.sh"
    assert "polygraphy replay of tiny.portable.onnx: ONNX Runtime CPU, runs here" in output
    assert f"sh {script}" in output
    assert len(replay_commands(script)) == 2 and not (tmp_path / "pg" / "tiny.tensorrt.onnx" / "replay.sh").exists()
    loaded_inputs = polygraphy_json.load_json(str(tmp_path / "pg" / "tiny.portable.onnx" / "3x1" / "inputs.json"))
    results = RunResults.load(str(tmp_path / "pg" / "tiny.portable.onnx" / "2x4" / "outputs.json"))
    assert [f["input_ids"].shape for f in loaded_inputs] == [(3, 1)]
    assert [it["logits"].shape for it in results["pytorch-float64"]] == [(2, 4, 32)]


@pytest.mark.slow
def test_each_replay_command_carries_the_bar_the_check_judged_that_shape_against(artifacts, tmp_path):
    report = tmp_path / "r.json"
    result = check_with_replays([artifacts.portable], artifacts.checkpoint, tmp_path / "pg", "--report", report)
    assert result.exit_code == 0, result.output
    checks = {tuple(c["shape"]): c["outputs"]["logits"] for c in json.loads(report.read_text())["checks"]}
    script = tmp_path / "pg" / "tiny.portable.onnx" / "replay.sh"
    commands = replay_commands(script)
    assert len(commands) == len(checks) == 2
    for command in commands:
        shape = tuple(int(d) for d in Path(option_values(command, "--load-inputs")[0]).parent.name.split("x"))
        outputs = script.parent / option_values(command, "--load-outputs")[0]
        reference = RunResults.load(str(outputs))["pytorch-float64"][0]["logits"]
        bar = checks[shape]
        l2 = float(option_values(command, "--l2-threshold")[0].removeprefix("logits:"))
        cosine = float(option_values(command, "--cosine-similarity-threshold")[0].removeprefix("logits:"))
        assert math.isclose(l2, bar["rel_l2_bar"] * np.linalg.norm(reference.astype(np.float64)), rel_tol=1e-12)
        assert cosine == bar["cosine_bar"]
        assert option_values(command, "--compare-func") == ["l2", "cosine_similarity"]
        assert "--plugins" not in command and (script.parent / command[2]).resolve() == artifacts.portable.resolve()


def polygraphy_env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.mark.slow
def test_the_printed_replay_of_a_portable_file_runs_polygraphy_and_passes(artifacts, tmp_path):
    result = check_with_replays([artifacts.portable], artifacts.checkpoint, tmp_path / "pg", "--shapes", "1,3")
    assert result.exit_code == 0, result.output
    script = next(line.split()[1] for line in result.output.splitlines() if line.strip().startswith("sh "))
    replay = subprocess.run(["sh", script], capture_output=True, text=True, env=polygraphy_env(), timeout=600)
    assert replay.returncode == 0, replay.stdout[-3000:] + replay.stderr[-3000:]
    assert "PASSED | L2 Norm" in replay.stdout + replay.stderr


@pytest.mark.slow
def test_the_replay_of_a_file_that_misses_its_bar_fails_in_polygraphy_too(artifacts, tmp_path):
    perturbed = tmp_path / "perturbed.portable.onnx"
    onnx.save(convert(onnx.load(str(artifacts.perturbed)), "portable"), str(perturbed))
    result = check_with_replays([perturbed], artifacts.checkpoint, tmp_path / "pg", "--shapes", "1,3")
    assert result.exit_code == 1 and "parity check failed" in result.output
    replay = subprocess.run(["sh", str(tmp_path / "pg" / perturbed.name / "replay.sh")], capture_output=True,
                            text=True, env=polygraphy_env(), timeout=600)
    assert replay.returncode != 0


@pytest.mark.slow
def test_a_tensorrt_target_replay_loads_the_built_plugin_and_builds_a_profile_of_each_shape(artifacts, tmp_path,
                                                                                          monkeypatch):
    library = tmp_path / "lib" / "libattnres_trt.so"
    monkeypatch.setattr(plugin_build, "find_libraries", lambda **_: SimpleNamespace(trt=library))
    result = check_with_replays([artifacts.tensorrt], artifacts.checkpoint, tmp_path / "pg")
    assert result.exit_code == 0, result.output
    assert "TensorRT with the attnres plugin (needs TensorRT and a GPU)" in " ".join(result.output.split())
    first, second = replay_commands(tmp_path / "pg" / "tiny.tensorrt.onnx" / "replay.sh")
    assert option_values(first, "--plugins") == [str(library)] and "--strongly-typed" in first
    for option in ("--trt-min-shapes", "--trt-opt-shapes", "--trt-max-shapes"):
        assert option_values(first, option) == ["input_ids:[2,4]"]
        assert option_values(second, option) == ["input_ids:[3,1]"]


@pytest.mark.parametrize(("target", "dtype", "runtime", "here"), [
    ("portable", "float16", ["--onnxrt", "--providers", "cpu"], True),
    ("portable", "bfloat16", ["--trt", "--strongly-typed"], False),
    ("ort-trt", "float32", None, False),
])
def test_each_kind_of_artifact_replays_where_it_can_run(tmp_path, target, dtype, runtime, here):
    artifact = Artifact(tmp_path / "m.onnx", dtype, False, {}, {}, {}, {}, target, lambda: None)
    flags, where, runs_here = replay_runtime(artifact)
    assert flags == runtime and runs_here == here and where
