"""onnxruntime-genai folders: ``attnres-export MODEL --with-past --target onnxruntime --genai DIR`` (docs/genai.md).

The with-past export of the ``onnxruntime`` target (``graphs/onnxruntime_ops``: attention as
``GroupQueryAttention``, experts as ``MoE``, Kimi Delta Attention as ``LinearAttention``, float32 RMSNorms as
``SimplifiedLayerNormalization``; ``--target portable`` is taken as the same) is written into a private folder
beside ``DIR`` as ``model.onnx`` (with ``model.onnx.data`` when over protobuf's limit); then ``genai_config.json``
(``genai_config.py``) and the checkpoint's tokenizer files join it. The model in the folder is checked against the
PyTorch model as any export is, and the folder is renamed into place; one that misses its parity bar is kept whole
as ``DIR.failed``, never as ``DIR``. Neither replaces a folder that an earlier ``--genai`` export did not write
(``genai_options.py``: checked before the export and again before the rename). The fused attnres nodes of the
``tensorrt`` target need a custom-op library that onnxruntime-genai cannot load yet.
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
from attnres_export.errors import PickledModelError
from attnres_export.exporter.checkpoint import quantized_for
from attnres_export.exporter.export import export_any, model_kind
from attnres_export.exporter.foreign import ForeignOptions
from attnres_export.exporter.genai_config import genai_config
from attnres_export.exporter.genai_options import (
    CONFIG_FILE,
    MODEL_FILE,
    check_folder,
    failed_folder,
    genai_options,
    tokenizer_files,
    tokens_folder,
)
from attnres_export.exporter.genai_tokens import GenerationDefaults, generation_defaults, json_file
from attnres_export.exporter.options import ExportOptions, ExportResult
from attnres_export.graphs.metadata import export_info
from attnres_export.graphs.onnxruntime_ops import OnnxRuntimeOps
from attnres_export.models.store import Checkpoint, open_checkpoint


def export_genai(opts: ExportOptions, folder: Path, foreign: ForeignOptions,
                 status: Callable[[str], None] = lambda _: None) -> ExportResult:
    """Export ``opts.source`` with past into a complete onnxruntime-genai folder at ``folder``."""
    folder = Path(folder)
    opts = genai_options(opts, folder)
    tokens_from = tokens_folder(opts.source)
    generation_defaults(tokens_from, hf_config_file=opts.source.is_dir())  # refuse before the export, not after
    with temporary_dir_beside(folder) as scratch:
        staged = scratch / "folder"
        staged.mkdir()  # under the umask, as a folder made by hand (the scratch folder itself is private)
        checkpoint = _opened(opts)
        result = export_any(replace(opts, output=staged / MODEL_FILE, check=False), foreign, status, checkpoint)
        status(f"writing {CONFIG_FILE}")
        path = staged / MODEL_FILE
        model = onnx.load(str(path), load_external_data=False)
        defaults = generation_defaults(tokens_from, int(export_info(model)["vocab_size"]),
                                       hf_config_file=opts.source.is_dir())
        hf_config = json_file(opts.source / "config.json") if opts.source.is_dir() else {}
        config = genai_config(model, MODEL_FILE, defaults, hf_config)
        ops = OnnxRuntimeOps.of(model)
        config["search"]["past_present_share_buffer"] = _shares_cache(ops)
        del model
        _write_config(staged, config)
        _copy_tokenizer(tokens_from, staged)
        report = None
        if opts.check:
            from attnres_export.exporter.checkpoint import check_export

            report = check_export(checkpoint, path, opts, status)
        target = folder if report is None or report.ok else failed_folder(folder)
        _move_into_place(staged, target, scratch)
    if report is not None:
        report.extra.update({"onnx": str(target / MODEL_FILE), "genai": str(target), "genai_tokens": _summary(defaults),
                             "onnxruntime_ops": ops.nodes if ops is not None else {}})
    return replace(result, path=target, files=sorted(target.iterdir()), report=report)


def _opened(opts: ExportOptions) -> Checkpoint | None:
    """``opts.source`` opened once for the export and its check (quantized on read with ``--quantize``); None for a
    model written elsewhere (the export says in one line why it has no with-past form)."""
    if model_kind(opts.source) != "checkpoint":
        return None
    try:
        return quantized_for(opts, open_checkpoint(opts.source))
    except PickledModelError:
        return None


def _shares_cache(ops: OnnxRuntimeOps | None) -> bool:
    """onnxruntime-genai may share one cache buffer between past and present only when every cached layer's
    attention is GroupQueryAttention (which appends in place); a standard-op layer concatenates a new one."""
    return ops is not None and ops.attention_layers > 0 and ops.nodes.get("GroupQueryAttention") == ops.attention_layers


def _write_config(folder: Path, config: dict) -> None:
    path = folder / CONFIG_FILE
    path.write_text(json.dumps(config, indent=4) + "\n")
    os.chmod(path, default_file_mode())


def _copy_tokenizer(source: Path, folder: Path) -> None:
    """The checkpoint's tokenizer files, when it has them (regular files in its folder, checked again here)."""
    for file in tokenizer_files(source):
        shutil.copyfile(file, folder / file.name)
        os.chmod(folder / file.name, default_file_mode())


def _move_into_place(staged: Path, folder: Path, scratch: Path) -> None:
    """Rename ``staged`` to ``folder``; a folder already there, checked again now that the export is done (empty,
    or an earlier ``--genai`` export's: ``genai_options.check_folder``), is moved into ``scratch`` first and
    removed with it."""
    check_folder(folder, "--genai")
    if folder.is_dir():
        os.replace(folder, scratch / "previous")
    os.replace(staged, folder)


def _summary(defaults: GenerationDefaults) -> dict:
    return {"eos_token_id": defaults.eos_token_ids, "bos_token_id": defaults.bos_token_id,
            "pad_token_id": defaults.pad_token_id, "from": defaults.sources}
