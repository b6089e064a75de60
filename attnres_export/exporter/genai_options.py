"""What ``--genai DIR`` accepts, checked before torch or onnx is imported (docs/genai.md): the with-past export of
the ``portable`` target in a type ONNX Runtime's CPU provider computes, into a folder that is new, empty or an
earlier onnxruntime-genai folder, and that holds no input."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from attnres_export.errors import ExportError
from attnres_export.exporter.options import ExportOptions

MODEL_FILE = "model.onnx"
CONFIG_FILE = "genai_config.json"
DTYPES = ("float32", "float16")
"""Storage types ONNX Runtime's CPU provider computes in (bfloat16 has no CPU kernels)."""


def genai_options(opts: ExportOptions, folder: Path) -> ExportOptions:
    """``opts`` for the ONNX inside ``folder``, after refusing in one line what cannot run under onnxruntime-genai."""
    if not opts.with_past:
        raise ExportError("--genai needs --with-past: onnxruntime-genai runs the KV-cache graph; add --with-past")
    if opts.target != "portable":
        raise ExportError(f"--genai needs --target portable: the {opts.target} target keeps fused attnres nodes, "
                          "which need a native custom-op library onnxruntime-genai cannot load yet")
    if opts.dtype not in DTYPES:
        raise ExportError(f"--genai: --dtype {opts.dtype} has no kernels on ONNX Runtime's CPU provider; export "
                          f"{' or '.join(DTYPES)}")
    if opts.output not in (None, Path(folder) / MODEL_FILE):
        raise ExportError(f"-o and --genai: the ONNX goes into the folder as {MODEL_FILE}; drop -o")
    check_folder(Path(folder), opts.source)
    return replace(opts, output=Path(folder) / MODEL_FILE)


def check_folder(folder: Path, source: Path) -> None:
    """The folder is new, empty or an onnxruntime-genai folder (replaced), and holds no input."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise ExportError(f"--genai {folder} is not a folder (a file or a link); choose a folder path")
    resolved, model = folder.resolve(), Path(source).resolve()
    if model == resolved or resolved in model.parents:
        raise ExportError(f"--genai {folder} holds MODEL {source}; choose a folder outside it")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / CONFIG_FILE).is_file():
        raise ExportError(f"--genai {folder} exists and is not an onnxruntime-genai folder (no {CONFIG_FILE}); "
                          "choose a new folder or empty it")
