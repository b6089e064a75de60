"""Long work shows progress where no terminal shows a spinner: a piped export prints each stage as a timed line on
stderr, its result stays on stdout, and a refusal after some progress is still one error line, the last one."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from attnres_export.cli import app
from attnres_export.cli.progress import PROGRESS_ENV, progress

runner = CliRunner()
TIMED = re.compile(r"^\d+:\d\d \S")


@pytest.fixture
def lines_on(monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)


def test_a_piped_export_prints_each_stage_once_as_a_timed_line_on_stderr(lines_on, block2_checkpoint, tmp_path):
    out = tmp_path / "m.onnx"
    result = runner.invoke(app, ["export", str(block2_checkpoint), "-o", str(out), "--no-check"])
    assert result.exit_code == 0, result.output
    stages = result.stderr.splitlines()
    assert stages and all(TIMED.match(line) for line in stages), result.stderr
    texts = [line.split(" ", 1)[1] for line in stages]
    assert texts[0] == "exporting" and any(t.startswith("loading ") for t in texts)
    assert any(t.startswith("tracing ") for t in texts) and len(texts) == len(set(texts))
    assert "wrote" in result.stdout and "wrote" not in result.stderr


def test_a_refusal_after_progress_is_the_one_error_line_and_the_last(lines_on, tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    result = runner.invoke(app, ["export", str(junk), "-o", str(tmp_path / "m.onnx")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == [lines[-1]] and "not a PyTorch checkpoint" in lines[-1], result.stderr
    assert lines[:-1] and all(TIMED.match(line) for line in lines[:-1]), result.stderr


def test_progress_off_prints_nothing_and_a_status_with_brackets_prints_as_written(monkeypatch, capsys):
    monkeypatch.setenv(PROGRESS_ENV, "off")
    with progress("silent") as status:
        status("still silent")
    assert capsys.readouterr().err == ""
    monkeypatch.delenv(PROGRESS_ENV)
    with progress("loading [model].pt") as status:
        status("loading [model].pt")
        status("tracing [bold]x[/bold]")
    assert [line.split(" ", 1)[1] for line in capsys.readouterr().err.splitlines()] == [
        "loading [model].pt", "tracing [bold]x[/bold]"]
