"""onnxruntime-genai folders: ``attnres-export MODEL --with-past --target portable --genai DIR`` (docs/genai.md).

The with-past export (parity-checked as any export) is written into a private folder beside ``DIR`` as
``model.onnx`` (with ``model.onnx.data`` when over protobuf's limit), then ``genai_config.json``
(``genai_config.py``) and the checkpoint's tokenizer files join it, and the folder is renamed into place. Only the
``portable`` target runs there: the fused attnres nodes of the other targets need a custom-op library that
onnxruntime-genai cannot load yet. A folder whose export missed its parity bar is kept as ``DIR.failed`` (its
``model.failed.onnx``, no config), never as ``DIR``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import onnx

from attnres_export.atomic import default_file_mode, temporary_dir_beside
from attnres_export.errors import ExportError
from attnres_export.exporter.export import export_any
from attnres_export.exporter.foreign import ForeignOptions
from attnres_export.exporter.genai_config import genai_config
from attnres_export.exporter.genai_options import CONFIG_FILE, MODEL_FILE, genai_options
from attnres_export.exporter.genai_tokens import GenerationDefaults, generation_defaults, json_file
from attnres_export.exporter.options import ExportOptions, ExportResult
from attnres_export.graphs.metadata import export_info

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja",
                   "chat_template.json")
"""What ``transformers``' ``save_pretrained`` writes for a tokenizer and onnxruntime-genai's tokenizer reads."""


def export_genai(opts: ExportOptions, folder: Path, foreign: ForeignOptions,
                 status: Callable[[str], None] = lambda _: None) -> ExportResult:
    """Export ``opts.source`` with past into a complete onnxruntime-genai folder at ``folder``."""
    folder = Path(folder)
    opts = genai_options(opts, folder)
    tokens_from = opts.source if opts.source.is_dir() else opts.source.parent
    generation_defaults(tokens_from, hf_config_file=opts.source.is_dir())  # refuse before the export, not after
    with temporary_dir_beside(folder) as scratch:
        staged = scratch / "folder"
        staged.mkdir()  # under the umask, as a folder made by hand (the scratch folder itself is private)
        result = export_any(replace(opts, output=staged / MODEL_FILE), foreign, status)
        if result.report is not None and not result.report.ok:
            failed = folder.with_name(folder.name + ".failed")
            _move_into_place(staged, failed, scratch)
            return replace(result, path=failed / result.path.name, files=sorted(failed.iterdir()))
        status(f"writing {CONFIG_FILE}")
        model = onnx.load(str(staged / MODEL_FILE), load_external_data=False)
        vocab = int(export_info(model)["vocab_size"])
        defaults = generation_defaults(tokens_from, vocab, hf_config_file=opts.source.is_dir())
        hf_config = json_file(opts.source / "config.json") if opts.source.is_dir() else {}
        _write_config(staged, genai_config(model, MODEL_FILE, defaults, hf_config))
        _copy_tokenizer(tokens_from, staged)
        _move_into_place(staged, folder, scratch)
    if result.report is not None:
        result.report.extra.update({"onnx": str(folder / MODEL_FILE), "genai": str(folder),
                                    "genai_tokens": _summary(defaults)})
    return replace(result, path=folder, files=sorted(folder.iterdir()))


def _write_config(folder: Path, config: dict) -> None:
    path = folder / CONFIG_FILE
    path.write_text(json.dumps(config, indent=4) + "\n")
    os.chmod(path, default_file_mode())


def _copy_tokenizer(source: Path, folder: Path) -> None:
    """The checkpoint's tokenizer files, when it has them (regular files only)."""
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / name)
            os.chmod(folder / name, default_file_mode())


def _move_into_place(staged: Path, folder: Path, scratch: Path) -> None:
    """Rename ``staged`` to ``folder``; a folder already there (checked by ``_check_folder``, or an earlier
    ``.failed`` one) is moved into ``scratch`` first and removed with it."""
    if folder.is_dir() and not folder.is_symlink():
        os.replace(folder, scratch / "previous")
    elif folder.exists() or folder.is_symlink():
        raise ExportError(f"{folder} exists and is not a folder; remove it")
    os.replace(staged, folder)


def _summary(defaults: GenerationDefaults) -> dict:
    return {"eos_token_id": defaults.eos_token_ids, "bos_token_id": defaults.bos_token_id,
            "pad_token_id": defaults.pad_token_id, "from": defaults.sources}
