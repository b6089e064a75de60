"""``attnres check``, ``attnres generate`` and ``api.check`` on a tiny random folder of every Hugging Face family
(``attnres example --arch``), plain and with-past exports, as they run on our own checkpoints: the checks pass,
another family's file is refused in one line, and greedy tokens of the with-past ONNX equal the PyTorch model's.
Slow: two exports per family."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attnres_export import api
from attnres_export.cli import app
from tests.serve.family_exports import FAMILIES, example_folder, export

pytestmark = pytest.mark.slow
runner = CliRunner()


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    folder = example_folder(request.param, out / "folder")
    return (request.param, folder, export(folder, out / "plain.onnx", with_past=False, target="tensorrt"),
            export(folder, out / "past.onnx", with_past=True))


def test_attnres_check_passes_the_plain_and_the_with_past_export(exported):
    _, folder, plain, past = exported
    for artifact in (plain, past):
        result = runner.invoke(app, ["check", str(folder), "--onnx", str(artifact)])
        assert result.exit_code == 0, result.output
    report = api.check(folder, onnx=[past], shapes=[(1, 1, 5), (2, 3, 0)])
    assert report.ok and report.checks and all("logits" in c.outputs for c in report.checks)


def test_greedy_tokens_of_the_with_past_onnx_equal_pytorch(exported):
    _, folder, _, past = exported
    runs = [runner.invoke(app, ["generate", str(folder), "--ids", "3,1,4,1,5", "--max-new-tokens", "32", "--json",
                                *extra]) for extra in ([], ["--onnx", str(past)])]
    assert all(r.exit_code == 0 for r in runs), [r.output for r in runs]
    torch_tokens, onnx_tokens = (json.loads(r.output.strip().splitlines()[-1])["tokens"] for r in runs)
    assert onnx_tokens == torch_tokens and len(onnx_tokens) == 32


def test_another_checkpoints_export_is_refused_in_one_line(exported, tmp_path):
    family, _, _, past = exported
    other = example_folder("llama" if family == "deepseek-v3" else "deepseek-v3", tmp_path / "other")
    result = runner.invoke(app, ["check", str(other), "--onnx", str(past)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "exported from another model" in lines[0] or "takes the inputs" in lines[0], lines[0]
