"""Commands import only what they use (issue 36, item 3): reading the command line, ``--help`` and every refusal that
needs no model (a missing file, a folder without config.json, a bad option value) import no torch, onnx or ONNX
Runtime, and an export without its check imports no ONNX Runtime, onnxruntime-extensions or Polygraphy.

Nothing here is timed (benchmarks/command_latency.py times the commands as whole processes): each child reports
which modules it imported, through ``sys.modules``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnres_export.errors import CheckpointError
from attnres_export.models.folder_files import require_config

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "onnx", "onnxruntime", "onnxscript", "onnx_ir", "onnxruntime_extensions", "polygraphy",
         "transformers")
CHECK_ONLY = ("onnxruntime", "onnxruntime_extensions", "polygraphy")
"""What only the parity check (and other commands' runs) use: an export with --no-check leaves them alone."""

CHILD = """
import json, sys
entry, argv, watched = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
import attnres_export.cli as cli
sys.argv = [entry, *argv]
code = None
try:
    (cli.export_main if entry == "attnres-export" else cli.main)()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "imported": [m for m in watched if m in sys.modules]}))
"""


def run_child(entry: str, argv: list[str], cwd: Path, watched=HEAVY) -> tuple[int, list[str], str]:
    """Run a console script's ``main`` in a fresh interpreter: its exit code, the watched modules it imported, and
    its stderr."""
    done = subprocess.run([sys.executable, "-c", CHILD, entry, json.dumps([str(a) for a in argv]),
                           json.dumps(list(watched))], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "PATH": "", "HOME": str(cwd)})
    lines = done.stdout.strip().splitlines()
    assert lines, done.stdout + done.stderr
    result = json.loads(lines[-1])
    return result["code"], result["imported"], done.stderr


def test_reading_the_command_line_imports_nothing_heavy():
    modules = ["attnres_export.cli", "attnres_export.cli.render", "attnres_export.exporter.export"]
    script = (f"import sys; {'; '.join(f'import {m}' for m in modules)}; "
              f"print([m for m in {list(HEAVY)!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


REFUSALS = [
    ("attnres-export", ["--help"], 0, ""),
    ("attnres-export", ["--version"], 0, ""),
    ("attnres", ["--help"], 0, ""),
    ("attnres", ["--version"], 0, ""),
    ("attnres-export", ["missing.pt", "--no-check"], 1, "MODEL missing.pt: no such file or folder"),
    ("attnres-export", ["missing.pt"], 1, "MODEL missing.pt: no such file or folder"),
    ("attnres-export", ["empty", "--no-check"], 1, "empty: a checkpoint folder needs config.json"),
    ("attnres-export", ["empty"], 1, "empty: a checkpoint folder needs config.json"),
    ("attnres-export", ["empty", "--opset", "3"], 2, "'--opset'"),
    ("attnres-export", ["empty", "--dtype", "fp17"], 2, "did you mean fp16?"),
    ("attnres", ["export", "empty", "-o", "m.onnx"], 1, "empty: a checkpoint folder needs config.json"),
    ("attnres", ["inspect", "empty"], 1, "empty: a checkpoint folder needs config.json"),
    ("attnres", ["inspect", "missing.pt"], 1, "FILE missing.pt: no such file or folder"),
    ("attnres", ["convert-checkpoint", "empty", "out"], 1, "empty: a checkpoint folder needs config.json"),
    ("attnres", ["check", "missing.pt", "--onnx", "a.onnx"], 1, "no such file or folder"),
    ("attnres", ["build", "missing.onnx"], 1, "missing.onnx: no such file"),
    ("attnres", ["generate", "empty", "--ids", "1", "--onnx", "a.onnx", "--engine", "b"], 1,
     "pass --onnx or --engine, not both"),
    ("attnres", ["generate", "empty"], 1, "pass exactly one of --ids and --prompt"),
]


@pytest.mark.parametrize(("entry", "argv", "code", "message"), REFUSALS,
                         ids=[f"{e} {' '.join(a)}" for e, a, _, _ in REFUSALS])
def test_help_version_and_refusals_that_need_no_model_import_no_torch(tmp_path, entry, argv, code, message):
    (tmp_path / "empty").mkdir()
    got, imported, err = run_child(entry, argv, tmp_path)
    reader = ["onnx"] if argv[0] == "build" else []  # `attnres build` reads its ONNX with onnx (no torch)
    assert (got or 0, imported) == (code, reader), err
    assert message in err, err


def test_a_folder_without_its_config_is_refused_by_one_check_that_the_cli_and_the_store_share(tmp_path):
    from attnres_export.models.store import open_checkpoint

    with pytest.raises(CheckpointError, match=r"a checkpoint folder needs config\.json") as early:
        require_config(tmp_path)
    with pytest.raises(CheckpointError) as reader:
        open_checkpoint(tmp_path)
    assert str(early.value) == str(reader.value)
    require_config(tmp_path / "missing.pt")  # not a folder: refused elsewhere, as before
    (tmp_path / "config.json").write_text("{}")
    require_config(tmp_path)


def test_an_export_without_its_check_imports_no_onnx_runtime_or_polygraphy(block2_checkpoint, tmp_path):
    code, imported, err = run_child("attnres-export", [block2_checkpoint, "--no-check", "-o", tmp_path / "m.onnx"],
                                    tmp_path, watched=("torch", *CHECK_ONLY))
    assert code in (0, None) and (tmp_path / "m.onnx").is_file(), err
    assert imported == ["torch"], f"an export without --check imported {imported}"
