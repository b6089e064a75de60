"""Usage errors are one line, exit 2, before any file is read or torch imported; closed choices come from their
one table and are listed in --help; both entry points share help style and --version."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from attnres_export import __version__
from attnres_export.backends.onnxruntime.providers import PROVIDERS
from attnres_export.cli import app, export_app
from attnres_export.cli.framework import run
from attnres_export.dtypes import STORAGE_TYPES
from attnres_export.errors import AttnresError
from attnres_export.graphs.target_names import EXPORT_TARGETS, TARGETS

ROOT = Path(__file__).resolve().parents[2]


def run_entry(capsys, monkeypatch, argv: list[str], application=app, prog: str = "attnres") -> tuple[int, str, str]:
    """The console script itself (framework.run, as `attnres`/`attnres-export` call it): exit code, stdout, stderr."""
    monkeypatch.setattr(sys, "argv", [prog, *map(str, argv)])
    with pytest.raises(SystemExit) as exited:
        run(application, prog)
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


USAGE_MISTAKES = [
    (["--dtype", "float64"], "'--dtype': 'float64' is not one of float32, float16, bfloat16"),
    (["--dtype", "fp17"], "did you mean fp16?"),
    (["--target", "coreml"], "'--target': 'coreml' is not one of tensorrt, portable"),
    (["--target", "ort-trt"], "'--target': 'ort-trt' is not one of tensorrt, portable"),
    (["--opset", "11"], "'--opset'"),
    (["--batch", "0:1:8"], "'--batch': '0:1:8': need 1 <= MIN <= OPT <= MAX"),
    (["--batch", "4:2:8"], "need 1 <= MIN <= OPT <= MAX"),
    (["--seq", "a:b"], "'--seq': 'a:b': expected MIN:OPT:MAX"),
    (["--past", "0:4"], "'--past': '0:4': expected MIN:OPT:MAX"),
    (["--tol", "float32:x"], "'--tol': 'float32:x'"),
    (["--tol", "float64:1e-3:0.99"], "DTYPE must be one of float32, float16, bfloat16"),
    (["--example-shape", "ids:2,x"], "'--example-shape': 'ids:2,x'"),
    (["--no-check", "--report", "r.json"], "--report needs the parity check"),
]


@pytest.mark.parametrize(("args", "pattern"), USAGE_MISTAKES, ids=[" ".join(a) for a, _ in USAGE_MISTAKES])
def test_a_malformed_export_option_is_a_one_line_usage_error_exit_2_naming_it(capsys, monkeypatch, tmp_path, args,
                                                                             pattern):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_entry(capsys, monkeypatch, ["absent.pt", "-o", "m.onnx", *args], export_app,
                               "attnres-export")
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and pattern in lines[0], out + err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("argv", "pattern"), [
    (["check", "m.pt", "--onnx", "a.onnx", "--ort-provider", "gpu"], "'--ort-provider': 'gpu' is not one of cpu, cuda"),
    (["check", "m.pt", "--onnx", "a.onnx", "--shapes", "2x4"], "'--shapes': '2x4': expected B,T or B,T,P"),
    (["convert", "a.onnx", "--target", "tensorrtt", "-o", "b.onnx"], "did you mean tensorrt?"),
])
def test_other_commands_refuse_a_typo_in_a_closed_choice_with_exit_2(capsys, monkeypatch, argv, pattern):
    code, _, err = run_entry(capsys, monkeypatch, argv)
    assert code == 2 and pattern in err and len(err.strip().splitlines()) == 1, err


def test_dtype_aliases_fp32_fp16_bf16_reach_the_exporter_as_storage_type_names(block2_checkpoint, tmp_path,
                                                                                monkeypatch, capsys):
    import attnres_export.exporter.export as export_module

    seen = []

    def record(opts, foreign, status):
        seen.append(opts.dtype)
        raise AttnresError("stop here")

    monkeypatch.setattr(export_module, "export_any", record)
    for alias in ("fp32", "fp16", "bf16"):
        code, _, _ = run_entry(capsys, monkeypatch, ["export", block2_checkpoint, "-o", tmp_path / "m.onnx",
                                                     "--dtype", alias, "--tol", f"{alias}:1e-2:0.99"])
        assert code == 1
    assert seen == ["float32", "float16", "bfloat16"]


def test_mistakes_are_reported_without_importing_torch_or_onnx(tmp_path):
    """A wrong path, a bad choice or a bad range ends before torch, onnx or ONNX Runtime is imported (each takes
    seconds to import under load; these mistakes took 26-36 s when they were found after the imports)."""
    script = """
import sys, time
from attnres_export.cli import export_main
codes = []
start = time.perf_counter()
for argv in (["missing.pt"], ["missing.pt", "--dtype", "fp17"], ["missing.pt", "--batch", "0:1:8"]):
    sys.argv = ["attnres-export", *argv]
    try:
        export_main()
    except SystemExit as exc:
        codes.append(exc.code)
print(codes, [m for m in ("torch", "onnx", "onnxruntime") if m in sys.modules], time.perf_counter() - start)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.stdout.startswith("[1, 2, 2] []"), done.stdout + done.stderr
    assert "missing.pt: no such file" in done.stderr


def test_help_lists_every_closed_choice_from_its_table(capsys, monkeypatch):
    _, export_help, _ = run_entry(capsys, monkeypatch, ["export", "--help"])
    _, convert_help, _ = run_entry(capsys, monkeypatch, ["convert", "--help"])
    _, check_help, _ = run_entry(capsys, monkeypatch, ["check", "--help"])
    assert f"[{'|'.join(STORAGE_TYPES)}]" in export_help and "fp16 = float16" in export_help
    assert f"[{'|'.join(EXPORT_TARGETS)}]" in export_help
    assert f"[{'|'.join(TARGETS)}]" in convert_help
    assert f"[{'|'.join(PROVIDERS)}]" in check_help


def test_attnres_export_help_reads_like_attnres_export_help(capsys, monkeypatch):
    _, alone, _ = run_entry(capsys, monkeypatch, ["--help"], export_app, "attnres-export")
    _, sub, _ = run_entry(capsys, monkeypatch, ["export", "--help"])
    assert alone.replace("attnres-export", "attnres export") == sub
    assert "╭" not in alone


@pytest.mark.parametrize(("argv", "application", "prog"), [(["--version"], app, "attnres"),
                                                           (["--version"], export_app, "attnres-export")])
def test_both_entry_points_print_the_version(capsys, monkeypatch, argv, application, prog):
    code, out, _ = run_entry(capsys, monkeypatch, argv, application, prog)
    assert code == 0 and out.strip() == f"attnres-export {__version__}"
