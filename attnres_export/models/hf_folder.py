"""Checkpoint folders in the Hugging Face layout (docs/models.md#checkpoint-folders), read without unpickling.

A folder holds ``config.json`` and ``model.safetensors`` (or shards listed by ``model.safetensors.index.json``).
Two kinds are read:

- **attnres** (written by ``attnres convert-checkpoint``): ``config.json`` carries ``attnres_format`` /
  ``attnres_version`` and our config under ``attnres_config``; the tensors have our state_dict names.
- **Hugging Face** (``model_type`` one of a registered family's ``hf_model_types``: Llama, Qwen2, Qwen3,
  Qwen3-MoE, DeepSeek-V3, with or without Kimi K3's AttnRes keys): the family's ``hf_reader`` parses
  ``config.json`` with transformers' semantics and names the state_dict; a key it does not apply is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from attnres_export.atomic import default_file_mode, temporary_dir_beside
from attnres_export.errors import CheckpointError
from attnres_export.models.folder_files import CONFIG_FILE, INDEX_FILE, WEIGHTS_FILE, require_config
from attnres_export.models.limits import MAX_CONFIG_DEPTH, check_depth
from attnres_export.models.registry import architecture, config_from_dict, for_hf_model_type, hf_model_types
from attnres_export.models.store.files import FORMAT, VERSION, safetensors_tensors
from attnres_export.models.store.quantized import QuantizedTensor, quantization_config_of, quantized_view
from attnres_export.models.store.tensors import StoredTensor, check_stored_type

MAX_CONFIG_BYTES = 1 << 20


def save_folder(state: dict[str, torch.Tensor], cfg, out_dir: Path,
                max_shard_bytes: int | None = None) -> list[Path]:
    """Write ``config.json`` and the weights (one file, or shards of at most ``max_shard_bytes`` plus an index)
    into ``out_dir``: everything is written into a temporary folder beside it and renamed into place last."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise CheckpointError(f"{out_dir} exists and is not an empty folder; choose a new output folder")
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    config = {"architectures": [architecture(cfg.arch).hf_architecture], "model_type": cfg.arch,
              "attnres_format": FORMAT, "attnres_version": VERSION, "attnres_config": cfg.to_dict()}
    shards = _shards(tensors, max_shard_bytes)
    with temporary_dir_beside(out_dir) as tmp:
        folder = tmp / "out"
        folder.mkdir()
        (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        if len(shards) == 1:
            save_file(shards[0], str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, shard in enumerate(shards, 1):
                name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(folder / name), metadata={"format": "pt"})
                weight_map |= dict.fromkeys(shard, name)
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        for file in folder.iterdir():
            file.chmod(default_file_mode())  # safetensors writes 0600; every file reads like config.json (umask)
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(folder, out_dir)
    return sorted(out_dir.iterdir())


def _shards(tensors: dict[str, torch.Tensor], max_bytes: int | None) -> list[dict[str, torch.Tensor]]:
    if not max_bytes:
        return [tensors]
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def read_folder(path: Path) -> tuple[Any, dict[str, StoredTensor]]:
    """``(typed config, tensors by our state_dict names)`` of a checkpoint folder, read from its config and the
    safetensors headers only (a Hugging Face folder through its family's reader: renamed, experts stacked)."""
    config = _read_config(path)
    if "attnres_format" in config:
        if config["attnres_format"] != FORMAT:
            raise CheckpointError(f"{path}: attnres_format is {config['attnres_format']!r}, expected {FORMAT!r}")
        if config.get("attnres_version") != VERSION:
            raise CheckpointError(f"{path}: checkpoint version {config.get('attnres_version')!r} is not supported "
                                  f"(this attnres reads {VERSION})")
        if "attnres_config" not in config:
            raise CheckpointError(f"{path}/{CONFIG_FILE} has no 'attnres_config' entry")
        return config_from_dict(config["attnres_config"]), _checked_types(safetensors_tensors(path), path)
    family = for_hf_model_type(str(config.get("model_type", "")))
    if family is not None:
        tensors = quantized_view(safetensors_tensors(path), quantization_config_of(config), str(path))
        return family.read_hf(config, _checked_types(tensors, path), str(path))
    raise CheckpointError(
        f"{path}: {CONFIG_FILE} describes neither an attnres checkpoint (no attnres_format) nor a model family "
        f"attnres reads (model_type {config.get('model_type')!r}; supported: {', '.join(hf_model_types())}); write "
        "an attnres checkpoint with `attnres convert-checkpoint IN.pt OUT_DIR`")


def _checked_types(tensors: dict[str, StoredTensor], path: Path) -> dict[str, StoredTensor]:
    """Every tensor that is not a quantized weight must be stored in one of ``STORED_TYPES``."""
    for name, tensor in tensors.items():
        if not isinstance(tensor, QuantizedTensor):
            check_stored_type(name, tensor.dtype, path)
    return tensors


def _read_config(path: Path) -> dict:
    require_config(path)
    file = path / CONFIG_FILE
    if file.stat().st_size > MAX_CONFIG_BYTES:
        raise CheckpointError(f"{file}: over {MAX_CONFIG_BYTES} bytes; not a model config")
    try:
        config = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{file}: not valid JSON ({exc})") from exc
    except RecursionError:
        raise CheckpointError(f"{file}: nested too deeply for Python's JSON reader (more than "
                              f"{MAX_CONFIG_DEPTH} levels is not a model config)") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: expected a JSON object")
    check_depth(config, str(file))
    return config
