"""onnxruntime-genai folders: ``attnres-export MODEL --with-past --target portable --genai DIR`` (docs/genai.md).

The with-past export of the ``portable`` target is written into a private folder beside ``DIR`` as ``model.onnx``
(with ``model.onnx.data`` when over protobuf's limit); its attention layers become ONNX Runtime's
``GroupQueryAttention`` (``genai_attention.py``: what makes a decode step as fast as the builder's) and its float32
RMSNorms ``SimplifiedLayerNormalization`` (``genai_norms.py``); then
``genai_config.json`` (``genai_config.py``) and the checkpoint's tokenizer files join it. The model in the folder is
checked against the PyTorch model as any export is, and the folder is renamed into place; one that misses its
parity bar is kept whole as ``DIR.failed``, never as ``DIR``. Neither replaces a folder that an earlier ``--genai``
export did not write (``genai_options.py``: checked before the export and again before the rename). The fused
attnres nodes of the other targets need a custom-op library that onnxruntime-genai cannot load yet.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
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
from attnres_export.graphs.metadata import EXPORT_KEY, export_info
from attnres_export.graphs.onnx_utils import set_metadata
from attnres_export.graphs.onnxruntime_ops.attention import group_query_attention
from attnres_export.graphs.onnxruntime_ops.norms import simplified_layer_norms
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
        rewrite = _onnx_runtime_ops(model, path, config)
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
                             "group_query_attention": f"{rewrite.layers} of {rewrite.of} layers",
                             "simplified_layer_norms": rewrite.norms})
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


@dataclass
class OnnxRuntimeOps:
    layers: int
    """Attention layers computed by GroupQueryAttention."""
    of: int
    norms: int
    """RMSNorms computed by SimplifiedLayerNormalization."""


def _onnx_runtime_ops(model: onnx.ModelProto, path: Path, config: dict) -> OnnxRuntimeOps:
    """Rewrite the staged model's attention as GroupQueryAttention (``genai_attention.py``) and its float32 RMSNorms
    as SimplifiedLayerNormalization (``genai_norms.py``), and save it; the cache buffer is shared between past and
    present only when every layer's attention was rewritten."""
    decoder = config["model"]["decoder"]
    attention = group_query_attention(model, decoder["num_attention_heads"], decoder["num_key_value_heads"])
    norms = simplified_layer_norms(model)
    if attention.layers or norms:
        info = export_info(model) | {"onnx_runtime_ops": {"GroupQueryAttention": attention.layers,
                                                          "SimplifiedLayerNormalization": norms}}
        set_metadata(model, EXPORT_KEY, json.dumps(info))
        onnx.save_model(model, str(path))
    config["search"]["past_present_share_buffer"] = attention.layers == attention.of
    return OnnxRuntimeOps(attention.layers, attention.of, norms)


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
