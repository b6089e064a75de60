"""transformers.js folders: ``attnres-export MODEL --with-past --target portable --hf-onnx DIR``
(docs/transformersjs.md).

The with-past export of the ``portable`` target is written into a private folder beside ``DIR`` as
``onnx/model.onnx`` (``onnx/model_fp16.onnx`` in float16), and checked against the PyTorch model as any export is.
Then it is made to follow what transformers.js 4 reads off the graph, which the names optimum and onnxruntime-genai
rely on already follow (``follow_transformers_js``; names only, no value changes):

- transformers.js makes the empty cache of the first step from each cache input's declared shape, knowing only the
  dim name ``batch_size`` (every other name becomes 0), so the dim ``batch`` is renamed ``batch_size``: with
  ``batch`` the first step fed a cache of batch 0 and failed in the first attention Reshape;
- it allocates one ``past_key_values.{i}.key`` and ``.value`` per layer (``getCacheNames``) and reads the cached
  length at axis -2 of the first, so DeepSeek-V3's latent cache (``.latent`` [batch, past, kv_lora_rank],
  ``.rope_key`` [batch, past, qk_rope_head_dim]) travels under those two names, inputs and presents alike;
- its external-data file is ``model.onnx_data`` (``use_external_data_format`` in config.json), not ``.onnx.data``.

``config.json`` (the source's, with ``transformers.js_config``), ``generation_config.json`` (the source's, or the
config's token ids) and the tokenizer files join it, and the folder is renamed into place; one whose model missed
its parity bar is kept whole as ``DIR.failed``, never as ``DIR``. Neither replaces a folder that an earlier
``--hf-onnx`` export did not write (``hf_onnx_options.py``: checked before the export and again before the rename).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx

from attnres_export.atomic import default_file_mode, temporary_dir_beside
from attnres_export.errors import ExportError, PickledModelError
from attnres_export.exporter.export import export_any, model_kind
from attnres_export.exporter.foreign import ForeignOptions
from attnres_export.exporter.genai_options import failed_folder, tokens_folder
from attnres_export.exporter.hf_onnx_options import (
    CONFIG_FILE,
    EXTERNAL_DATA_SUFFIX,
    GENERATION_CONFIG_FILE,
    JS_DTYPES,
    MODEL_FILES,
    ONNX_DIR,
    check_folder,
    hf_onnx_options,
    model_file,
    read_json,
    shipped_files,
)
from attnres_export.exporter.options import ExportOptions, ExportResult
from attnres_export.graphs.metadata import EXPORT_KEY, export_info
from attnres_export.graphs.onnx_utils import set_metadata
from attnres_export.graphs.save import check_written
from attnres_export.models.base import PAST_PREFIX, PRESENT_PREFIX
from attnres_export.models.store import Checkpoint, open_checkpoint

DIMS = {"batch": "batch_size"}
"""Dim names renamed for transformers.js: the only symbol it resolves in a cache shape is ``batch_size``."""
LATENT_CACHE = {"latent": "key", "rope_key": "value"}
"""A latent-attention layer's two cache entries, under the names transformers.js allocates a layer's cache by."""
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
_CACHE_NAME = re.compile(rf"^{re.escape(PAST_PREFIX)}(\d+)\.(\w+)$")


def export_hf_onnx(opts: ExportOptions, folder: Path, foreign: ForeignOptions,
                   status: Callable[[str], None] = lambda _: None) -> ExportResult:
    """Export the Hugging Face folder ``opts.source`` with past into a complete transformers.js folder at
    ``folder``."""
    folder = Path(folder)
    opts = hf_onnx_options(opts, folder)
    shipped = shipped_files(tokens_folder(opts.source))
    with temporary_dir_beside(folder) as scratch:
        staged = scratch / "folder"
        staged.mkdir()  # under the umask, as a folder made by hand (the scratch folder itself is private)
        (staged / ONNX_DIR).mkdir()
        path = staged / model_file(opts.dtype)
        checkpoint = _opened(opts.source)
        result = export_any(replace(opts, output=path, check=False), foreign, status, checkpoint)
        report = None
        if opts.check:
            from attnres_export.exporter.checkpoint import check_export

            report = check_export(checkpoint, path, opts, status)
        status("writing the transformers.js folder")
        conventions = follow_transformers_js(path)
        _write_json(staged / CONFIG_FILE, folder_config(read_json(opts.source / CONFIG_FILE), opts.dtype,
                                                        conventions.external_data is not None))
        _copy(shipped, staged)
        if not (staged / GENERATION_CONFIG_FILE).is_file():
            _write_json(staged / GENERATION_CONFIG_FILE, generation_config(read_json(opts.source / CONFIG_FILE)))
        target = folder if report is None or report.ok else failed_folder(folder)
        _move_into_place(staged, target, scratch)
    if report is not None:
        report.extra.update({"onnx": str(target / model_file(opts.dtype)), "hf_onnx": str(target),
                             "transformers_js": conventions.summary()})
    files = sorted(p for p in target.rglob("*") if p.is_file())
    return replace(result, path=target, files=files, report=report)


def _opened(source: Path) -> Checkpoint | None:
    """``source`` opened once for the export and its check; None for a model written elsewhere (the export says
    in one line why it has no with-past form)."""
    if model_kind(source) != "checkpoint":
        return None
    try:
        return open_checkpoint(source)
    except PickledModelError:
        return None


@dataclass
class Conventions:
    """What ``follow_transformers_js`` renamed."""

    dims: dict[str, str] = field(default_factory=dict)
    cache: dict[str, str] = field(default_factory=dict)
    """Graph inputs and outputs renamed (DeepSeek-V3's latent cache)."""
    external_data: str | None = None
    """The external-data file, when the weights are in one."""

    def summary(self) -> dict:
        return {"dims": self.dims, "cache": self.cache, "external_data": self.external_data}


def follow_transformers_js(path: Path) -> Conventions:
    """Rename the dims, cache entries and external-data file of the with-past model at ``path`` as transformers.js
    reads them (the module docstring), record the renames in its export metadata (``transformers_js``) and save it
    in place; the values are untouched."""
    model = onnx.load(str(path), load_external_data=False)
    info = export_info(model)
    cache = cache_renames(info.get("cache", []))
    _rename_values(model.graph, cache)
    dims = {old: new for old, new in DIMS.items() if _rename_dims(model.graph, old, new)}
    external = _external_data(model, path)
    conventions = Conventions(dims, cache, external)
    set_metadata(model, EXPORT_KEY, json.dumps(info | {"transformers_js": conventions.summary()}))
    onnx.save_model(model, str(path))
    check_written(path, path.name)
    return conventions


def cache_renames(cache: list[dict]) -> dict[str, str]:
    """Past and present names to rename so that every layer's cache is one ``key`` and one ``value`` with the past
    at axis -2 (where transformers.js reads the cached length); a cache of another layout is refused in one line
    naming its first entry."""
    layers: dict[int, dict[str, dict]] = {}
    for entry in cache:
        found = _CACHE_NAME.match(entry["name"])
        if found is None or entry["axes"][-2:-1] != ["past"]:
            raise _not_allocated(entry)
        layers.setdefault(int(found.group(1)), {})[found.group(2)] = entry
    renames: dict[str, str] = {}
    for index, entries in sorted(layers.items()):
        kinds = set(entries)
        if kinds == {"key", "value"}:
            continue
        if kinds != set(LATENT_CACHE):
            raise _not_allocated(next(iter(entries.values())))
        for kind, entry in entries.items():
            renames[entry["name"]] = f"{PAST_PREFIX}{index}.{LATENT_CACHE[kind]}"
            renames[entry["present"]] = f"{PRESENT_PREFIX}{index}.{LATENT_CACHE[kind]}"
    return renames


def _not_allocated(entry: dict) -> ExportError:
    return ExportError(f"--hf-onnx: the cache entry {entry['name']} {entry['axes']} is not a layout transformers.js "
                       "allocates (one key and one value per layer, the past at axis -2)")


def _rename_values(graph: onnx.GraphProto, renames: dict[str, str]) -> None:
    """Rename values everywhere ``graph`` names them: its inputs, outputs and value infos, and every node's inputs
    and outputs, in subgraphs too (a branch may read an outer value)."""
    if not renames:
        return
    for value in (*graph.input, *graph.output, *graph.value_info):
        value.name = renames.get(value.name, value.name)
    for node in graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
        node.output[:] = [renames.get(name, name) for name in node.output]
        for attribute in node.attribute:
            for sub in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                _rename_values(sub, renames)


def _rename_dims(graph: onnx.GraphProto, old: str, new: str) -> int:
    """Rename the dim ``old`` ``new`` in every declared shape of ``graph`` and its subgraphs; how many."""
    count = 0
    for value in (*graph.input, *graph.output, *graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == old:
                dim.dim_param = new
                count += 1
    for node in graph.node:
        for attribute in node.attribute:
            for sub in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                count += _rename_dims(sub, old, new)
    return count


def _external_data(model: onnx.ModelProto, path: Path) -> str | None:
    """Move the weights' external-data file (``model.onnx.data`` as exported) to ``model.onnx_data`` beside
    ``path`` and point the initializers at it; its new name, or None when the weights are in the graph."""
    entries = [entry for init in model.graph.initializer for entry in init.external_data if entry.key == "location"]
    if not entries:
        return None
    locations = {entry.value for entry in entries}
    if len(locations) != 1:
        raise ExportError(f"--hf-onnx: {path.name} keeps its weights in {len(locations)} files; transformers.js "
                          "reads one")
    name = path.name + EXTERNAL_DATA_SUFFIX
    os.replace(path.parent / locations.pop(), path.parent / name)
    for entry in entries:
        entry.value = name
    return name


def folder_config(config: dict, dtype: str, external_data: bool) -> dict:
    """The source's config.json with ``transformers.js_config``: the dtype whose file the folder holds (what
    transformers.js loads when not told otherwise; in a browser its default would be a quantized file), and that
    file's external data when it has some."""
    settings: dict = {"dtype": JS_DTYPES[dtype]}
    if external_data:
        settings["use_external_data_format"] = {MODEL_FILES[dtype]: 1}
    return {**config, "transformers.js_config": settings}


def generation_config(config: dict) -> dict:
    """A generation_config.json for a folder that has none: the config's token ids, as transformers'
    ``GenerationConfig.from_model_config`` takes them."""
    return {**{key: config[key] for key in TOKEN_IDS if config.get(key) is not None}, "_from_model_config": True}


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
    os.chmod(path, default_file_mode())


def _copy(files: list[Path], folder: Path) -> None:
    for file in files:
        shutil.copyfile(file, folder / file.name)
        os.chmod(folder / file.name, default_file_mode())


def _move_into_place(staged: Path, folder: Path, scratch: Path) -> None:
    """Rename ``staged`` to ``folder``; a folder already there, checked again now that the export is done (empty,
    or an earlier ``--hf-onnx`` export's: ``hf_onnx_options.check_folder``), is moved into ``scratch`` first and
    removed with it."""
    check_folder(folder, "--hf-onnx")
    if folder.is_dir():
        os.replace(folder, scratch / "previous")
    os.replace(staged, folder)
