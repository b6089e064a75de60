"""What ``--genai DIR`` accepts, checked before torch or onnx is imported (docs/genai.md): the with-past export of
the ``portable`` target in a type ONNX Runtime's CPU provider computes, into a folder that is new, empty or an
earlier ``--genai`` folder, that holds no input and no other output, beside a ``DIR.failed`` of the same kind; and
tokenizer files that lie in the model's folder (the folder is made to be shipped)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from attnres_export.atomic import check_outputs
from attnres_export.errors import ExportError
from attnres_export.exporter.options import ExportOptions
from attnres_export.exporter.output_folders import refuse_unless_replaceable

MODEL_FILE = "model.onnx"
CONFIG_FILE = "genai_config.json"
DTYPES = ("float32", "float16")
"""Storage types ONNX Runtime's CPU provider computes in (bfloat16 has no CPU kernels)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja",
                   "chat_template.json")
"""What ``transformers``' ``save_pretrained`` writes for a tokenizer and onnxruntime-genai's tokenizer reads."""
FOLDER_FILES = frozenset({MODEL_FILE, MODEL_FILE + ".data", CONFIG_FILE, *TOKENIZER_FILES})
"""Every file a ``--genai`` folder can hold."""


def genai_options(opts: ExportOptions, folder: Path, outputs: Mapping[str, Path | None] | None = None
                  ) -> ExportOptions:
    """``opts`` for the ONNX inside ``folder``, after refusing in one line what cannot run under onnxruntime-genai,
    and any folder, input or other output (``outputs``: ``--report``) the export would replace."""
    if not opts.with_past:
        raise ExportError("--genai needs --with-past: onnxruntime-genai runs the KV-cache graph; add --with-past")
    if opts.target not in ("onnxruntime", "portable"):
        raise ExportError(f"--genai needs --target onnxruntime: the {opts.target} target keeps fused attnres nodes, "
                          "which need a native custom-op library onnxruntime-genai cannot load yet")
    if opts.dtype not in DTYPES:
        raise ExportError(f"--genai: --dtype {opts.dtype} has no kernels on ONNX Runtime's CPU provider; export "
                          f"{' or '.join(DTYPES)}")
    folder = Path(folder)
    if opts.output not in (None, folder / MODEL_FILE):
        raise ExportError(f"-o and --genai: the ONNX goes into the folder as {MODEL_FILE}; drop -o")
    folders = genai_folders(folder, opts.check)
    check_outputs(outputs or {}, {"MODEL": opts.source}, folders)
    for option, path in folders.items():
        check_folder(path, option)
    tokenizer_files(tokens_folder(opts.source))
    return replace(opts, output=folder / MODEL_FILE, target="onnxruntime", matmul_nbits=True)


def failed_folder(folder: Path) -> Path:
    """Where a folder whose model missed its parity bar is kept: ``DIR.failed`` beside ``DIR``."""
    return folder.with_name(folder.name + ".failed")


def genai_folders(folder: Path, check: bool) -> dict[str, Path]:
    """The folders ``--genai DIR`` may write, named for messages: ``DIR``, and ``DIR.failed`` when a check runs."""
    return {"--genai": folder, **({"--genai's failed copy": failed_folder(folder)} if check else {})}


def check_folder(folder: Path, option: str) -> None:
    """A folder the export may replace is new, empty, or one an earlier ``--genai`` export wrote (only the files it
    writes, its model stamped by attnres-export): a folder the command did not write is never replaced."""
    refuse_unless_replaceable(folder, option, "an onnxruntime-genai folder", _not_written_by_genai_export)


def _not_written_by_genai_export(folder: Path) -> str | None:
    """Why ``folder`` is not a ``--genai`` export's (None when it is)."""
    for entry in sorted(folder.iterdir()):
        if entry.name not in FOLDER_FILES:
            return f"it holds {entry.name}"
        if entry.is_symlink() or not entry.is_file():
            return f"its {entry.name} is not a regular file"
    if not (folder / CONFIG_FILE).is_file():
        return f"no {CONFIG_FILE}"
    from attnres_export.graphs.metadata import records_export

    if not records_export(folder / MODEL_FILE):
        return f"its {MODEL_FILE} is not an attnres-export model"
    return None


def tokens_folder(source: Path) -> Path:
    """Where a checkpoint's tokenizer and generation files are: its folder, or a ``.pt``'s own folder."""
    return source if source.is_dir() else source.parent


def tokenizer_files(folder: Path) -> list[Path]:
    """The tokenizer files in ``folder`` that the genai folder gets; a link out of ``folder`` is refused, since the
    genai folder is made to be shipped (a link in a downloaded model could name any file of the user's)."""
    files = [folder / name for name in TOKENIZER_FILES if (folder / name).is_file()]
    inside = folder.resolve()
    for file in files:
        if not file.resolve().is_relative_to(inside):
            raise ExportError(f"MODEL's {file.name} is a link to {file.resolve()}, outside the model folder {folder}; "
                              "the --genai folder is made to be shipped, so copy that file into the model folder "
                              "(a Hugging Face cache snapshot: download with --local-dir)")
    return files
