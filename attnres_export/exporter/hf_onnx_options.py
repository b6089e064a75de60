"""What ``--hf-onnx DIR`` accepts, checked before torch or onnx is imported (docs/transformersjs.md): the with-past
export of the ``portable`` target, in float32 or float16, of a Hugging Face folder whose ``model_type`` transformers.js
runs as a decoder with a key/value cache; into a folder that is new, empty or an earlier ``--hf-onnx`` folder, that
holds no input and no other output, beside a ``DIR.failed`` of the same kind. The folder is made to be shipped, so
the tokenizer and generation files it copies must lie in the model's folder."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from attnres_export.atomic import check_outputs
from attnres_export.errors import ExportError
from attnres_export.exporter.genai_options import TOKENIZER_FILES, failed_folder, tokens_folder
from attnres_export.exporter.options import ExportOptions
from attnres_export.exporter.output_folders import json_object, refuse_unless_replaceable

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
ONNX_DIR = "onnx"
MODEL_FILES = {"float32": "model.onnx", "float16": "model_fp16.onnx"}
"""The file transformers.js loads for each storage type (its ``dtype`` option: ``fp32``, ``fp16``; the file name
is ``model`` plus the dtype's suffix)."""
JS_DTYPES = {"float32": "fp32", "float16": "fp16"}
EXTERNAL_DATA_SUFFIX = "_data"
"""transformers.js (and optimum) name a model's external-data file ``model.onnx_data``, not ``model.onnx.data``."""
MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3")
"""The ``model_type`` values of our decoder bodies that transformers.js 4 maps to a causal LM whose cache it
allocates as one key and one value per layer (``getCacheNames``)."""
NOT_RUN = {
    "kimi_linear": "its Kimi Delta Attention layers carry recurrent and convolution states, and transformers.js "
                   "has no kimi_linear model to allocate them",
    "kimi_k3": "its Kimi Delta Attention layers carry recurrent and convolution states, and transformers.js has "
               "no kimi_k3 model to allocate them",
}
FOLDER_FILES = frozenset({CONFIG_FILE, GENERATION_CONFIG_FILE, *TOKENIZER_FILES})
ONNX_FILES = frozenset({name + tail for name in MODEL_FILES.values() for tail in ("", EXTERNAL_DATA_SUFFIX)})
"""Every file an ``--hf-onnx`` folder can hold: these at its top, ``ONNX_FILES`` in its ``onnx/``."""


def model_file(dtype: str) -> str:
    """``onnx/<file>`` of the model of a ``dtype`` export, relative to the folder."""
    return f"{ONNX_DIR}/{MODEL_FILES[dtype]}"


def hf_onnx_options(opts: ExportOptions, folder: Path, outputs: Mapping[str, Path | None] | None = None
                    ) -> ExportOptions:
    """``opts`` for the ONNX inside ``folder``, after refusing in one line what transformers.js cannot run, and any
    folder, input or other output (``outputs``: ``--report``) the export would replace."""
    if not opts.with_past:
        raise ExportError("--hf-onnx needs --with-past: transformers.js generates with the KV-cache graph; add "
                          "--with-past")
    if opts.target != "portable":
        raise ExportError(f"--hf-onnx needs --target portable: the {opts.target} target keeps fused attnres nodes, "
                          "custom ops that transformers.js's ONNX Runtime cannot load")
    if opts.dtype not in MODEL_FILES:
        raise ExportError(f"--hf-onnx: --dtype {opts.dtype} has no kernels in ONNX Runtime's CPU and WebAssembly "
                          f"backends, where transformers.js runs; export {' or '.join(MODEL_FILES)}")
    folder = Path(folder)
    path = folder / model_file(opts.dtype)
    if opts.output not in (None, path):
        raise ExportError(f"-o and --hf-onnx: the ONNX goes into the folder as {model_file(opts.dtype)}; drop -o")
    hf_model_type(opts.source)
    folders = hf_onnx_folders(folder, opts.check)
    check_outputs(outputs or {}, {"MODEL": opts.source}, folders)
    for option, each in folders.items():
        check_folder(each, option)
    shipped_files(tokens_folder(opts.source))
    return replace(opts, output=path)


def hf_model_type(source: Path) -> str:
    """The ``model_type`` of the Hugging Face folder ``source``, refused in one line unless transformers.js runs it."""
    runs = ", ".join(MODEL_TYPES)
    if not source.is_dir():
        raise ExportError(f"--hf-onnx needs a Hugging Face folder of a decoder body ({runs}): transformers.js picks "
                          f"its model by config.json's model_type, and {source.name} is an attnres checkpoint file; "
                          "export a Hugging Face folder")
    config = read_json(source / CONFIG_FILE)
    model_type = config.get("model_type")
    if model_type in MODEL_TYPES:
        return model_type
    if model_type in NOT_RUN:
        raise ExportError(f"--hf-onnx: transformers.js cannot run a {model_type} model: {NOT_RUN[model_type]}")
    what = f"model_type {model_type!r}" if model_type is not None else "no model_type (an attnres checkpoint)"
    raise ExportError(f"--hf-onnx: {source / CONFIG_FILE} has {what}; transformers.js runs the decoder bodies "
                      f"{runs} from this exporter")


def read_json(path: Path) -> dict:
    """A JSON object file of the source folder (at most 1 MB), or {} when there is none."""
    return json_object(path, "--hf-onnx")


def hf_onnx_folders(folder: Path, check: bool) -> dict[str, Path]:
    """The folders ``--hf-onnx DIR`` may write, named for messages: ``DIR``, and ``DIR.failed`` when a check runs."""
    return {"--hf-onnx": folder, **({"--hf-onnx's failed copy": failed_folder(folder)} if check else {})}


def check_folder(folder: Path, option: str) -> None:
    """A folder the export may replace is new, empty, or one an earlier ``--hf-onnx`` export wrote (only the files
    it writes, its model stamped by attnres-export): a folder the command did not write is never replaced."""
    refuse_unless_replaceable(folder, option, "a transformers.js folder", _not_written_by_hf_onnx_export)


def _not_written_by_hf_onnx_export(folder: Path) -> str | None:
    """Why ``folder`` is not an ``--hf-onnx`` export's (None when it is)."""
    for entry in sorted(folder.iterdir()):
        if entry.name == ONNX_DIR and entry.is_dir() and not entry.is_symlink():
            continue
        if entry.name not in FOLDER_FILES:
            return f"it holds {entry.name}"
        if entry.is_symlink() or not entry.is_file():
            return f"its {entry.name} is not a regular file"
    onnx_dir = folder / ONNX_DIR
    if not (folder / CONFIG_FILE).is_file() or not onnx_dir.is_dir():
        return f"no {CONFIG_FILE} and {ONNX_DIR}/"
    for entry in sorted(onnx_dir.iterdir()):
        if entry.name not in ONNX_FILES:
            return f"it holds {ONNX_DIR}/{entry.name}"
        if entry.is_symlink() or not entry.is_file():
            return f"its {ONNX_DIR}/{entry.name} is not a regular file"
    from attnres_export.graphs.metadata import records_export

    models = [onnx_dir / name for name in MODEL_FILES.values() if (onnx_dir / name).is_file()]
    if not models or not all(records_export(path) for path in models):
        return f"its {ONNX_DIR}/ holds no attnres-export model"
    return None


def shipped_files(folder: Path) -> list[Path]:
    """The tokenizer files and ``generation_config.json`` in ``folder`` that the transformers.js folder gets; a link
    out of ``folder`` is refused, since the folder is made to be shipped (a link in a downloaded model could name
    any file of the user's)."""
    files = [folder / name for name in (*TOKENIZER_FILES, GENERATION_CONFIG_FILE) if (folder / name).is_file()]
    inside = folder.resolve()
    for file in files:
        if not file.resolve().is_relative_to(inside):
            raise ExportError(f"MODEL's {file.name} is a link to {file.resolve()}, outside the model folder {folder}; "
                              "the --hf-onnx folder is made to be shipped, so copy that file into the model folder "
                              "(a Hugging Face cache snapshot: download with --local-dir)")
    return files
