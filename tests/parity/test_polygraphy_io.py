"""Inputs and reference outputs saved for Polygraphy load back with Polygraphy's own loaders."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from attnres_export.cli import app
from attnres_export.parity.polygraphy_io import save_polygraphy

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


def test_check_saves_its_inputs_and_reference_outputs_for_polygraphy(artifacts, tmp_path):
    result = CliRunner().invoke(app, ["check", str(artifacts.checkpoint), "--onnx", str(artifacts.tensorrt),
                                      "--save-polygraphy", str(tmp_path / "pg")])
    assert result.exit_code == 0, result.output
    assert "polygraphy run" in result.output
    loaded_inputs = polygraphy_json.load_json(str(tmp_path / "pg" / "inputs.json"))
    results = RunResults.load(str(tmp_path / "pg" / "outputs.json"))
    assert [f["input_ids"].shape for f in loaded_inputs] == [(2, 4), (3, 1)]
    assert [it["logits"].shape for it in results["pytorch-float32"]] == [(2, 4, 32), (3, 1, 32)]
