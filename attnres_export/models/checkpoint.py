"""Checkpoint read/write (docs/models.md#checkpoint-format), loaded with ``weights_only=True``: no code runs on load."""

from __future__ import annotations

import pickle
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnres_export.atomic import atomic_write
from attnres_export.dtypes import STORAGE_TYPES, torch_dtype
from attnres_export.errors import CheckpointError
from attnres_export.models.base import KeepFloat32
from attnres_export.models.limits import layer_count_refusal, layer_index, layer_indices
from attnres_export.models.registry import architecture, build_model, config_from_dict
from attnres_export.models.threads import single_threaded

FORMAT = "attnres-checkpoint"
VERSION = 1


def save_checkpoint(model: nn.Module, cfg, path: Path) -> None:
    """Write ``{"format", "version", "config", "state_dict"}`` atomically."""
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "config": cfg.to_dict(),
        "state_dict": {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
    }
    with atomic_write(Path(path)) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(path: Path, dtype: str | None = "float32") -> tuple[nn.Module, Any]:
    """Load a checkpoint (a ``.pt`` file, or a folder with config.json and safetensors weights: our own layout or
    K3 conventions, docs/models.md#checkpoint-folders) into a model in eval mode; anything else is refused
    with one line.

    Weights are held in ``dtype`` (``None``: as stored), except that the aggregation and rotary tensors are never
    below float32 (``KeepFloat32``). The model is built without allocating weights, and a tensor already in its
    type is used as read (memory-mapped from a ``.pt``): loading holds the weights once."""
    path = Path(path)
    if path.is_dir():
        from attnres_export.models.hf_folder import read_folder

        config, state = read_folder(path)
        payload = {"config": config, "state_dict": state}
        reread = None
    else:
        payload = _read_payload(path)
        reread = _rereader(path) if zipfile.is_zipfile(path) else None
    cfg = config_from_dict(payload["config"])
    _check_sizes_before_building(cfg, payload["state_dict"], path)
    with torch.device("meta"):
        model = build_model(cfg)
    _load_state(model, payload["state_dict"], path, dtype, reread)
    return model.eval(), cfg


STORED_TYPES = frozenset(torch_dtype(name) for name in STORAGE_TYPES)
"""The types weights may be stored in: the storage types (float32, float16, bfloat16). float64 (no export holds
it) and the float8 types (quantized checkpoints, read by no family yet) are refused by ``check_stored_type``, the one
place that decides. A one-byte type admitted here needs ``_finite`` to widen it first: torch calls every
float8_e8m0fnu value finite, its NaN (0xFF) included."""


def check_stored_type(name: str, tensor: torch.Tensor, where: Any) -> None:
    """Refuse a tensor stored in a type other than ``STORED_TYPES``, naming it and its type."""
    if tensor.dtype not in STORED_TYPES:
        raise CheckpointError(f"{where}: {name} is stored as {str(tensor.dtype).removeprefix('torch.')}; attnres "
                              "reads weights stored as float32, float16 or bfloat16 (convert the checkpoint to one "
                              "of them)")


CAST_GROUP_BYTES = 256 << 20
"""Stored bytes cast per mapping of the checkpoint. The pages a mapping has read stay resident until it is
closed, so a load that casts (a float32 checkpoint loaded in float16) maps the file once per group of about
this size and closes it before the next: the stored weights are never all resident beside the cast ones."""


def _rereader(path: Path) -> Callable[[], dict]:
    """A fresh memory-mapped read of the checkpoint's state_dict (its tensors only; nothing is read yet)."""
    def reread() -> dict:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)["state_dict"]

    return reread


def stored_as(model: nn.Module, dtype: str) -> bool:
    """Are ``model``'s weights held as a ``dtype`` model holds them (``KeepFloat32`` tensors at least float32)?"""
    state = model.state_dict()
    return _held_as(state, _stored_types(model, state, dtype))


def model_as(model: nn.Module, dtype: str) -> nn.Module:
    """``model`` with its weights in ``dtype`` (``KeepFloat32`` tensors never below float32): ``model`` itself when
    they already are, else a new model that shares every tensor already in its type."""
    state = model.state_dict()
    wanted = _stored_types(model, state, dtype)
    if _held_as(state, wanted):
        return model
    with torch.device("meta"):
        twin = build_model(model.config)
    twin.load_state_dict({key: tensor.to(wanted[key]) for key, tensor in state.items()}, assign=True)
    return twin.eval()


def _held_as(state: dict, wanted: dict[str, torch.dtype]) -> bool:
    return all(tensor.dtype == wanted[key] for key, tensor in state.items())


def _stored_types(model: nn.Module, state: dict, dtype: str | None) -> dict[str, torch.dtype]:
    """The type each state_dict entry is held in: ``dtype`` (or as stored), at least float32 under ``KeepFloat32``."""
    keep = {f"{prefix}.{name}" if prefix else name
            for prefix, module in model.named_modules() if isinstance(module, KeepFloat32)
            for name in module.float32_state_names()}
    types = {}
    for key, tensor in state.items():
        held = tensor.dtype if dtype is None else torch_dtype(dtype)
        types[key] = torch.promote_types(held, torch.float32) if key in keep else held
    return types


def _read_payload(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file; pass the path of an attnres checkpoint (.pt)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if found is None and not _is_pickle_stream(path):
            raise CheckpointError(f"{path}: not a PyTorch checkpoint (corrupted, or another format)") from exc
        what = f"pickled Python objects ({found.group(1)})" if found else "a raw pickle stream"
        raise CheckpointError(
            f"{path}: holds {what}, which needs full unpickling, and unpickling runs code from the file, so "
            f"attnres does not do it. If this is a whole nn.Module you trust, `attnres-export {path.name} "
            "--trust-pickle --example-shape ...` unpickles it and fuses its aggregations by pattern; otherwise save "
            "{'format', 'version', 'config', 'state_dict'} as in docs/models.md#checkpoint-format "
            "(attnres_export.models.save_checkpoint)"
        ) from exc
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, KeyError, IndexError,
            UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable PyTorch file ({type(exc).__name__}: {_first_line(exc)}); "
                              "is it corrupted?") from exc
    if not isinstance(payload, dict) or "format" not in payload:
        raise CheckpointError(
            f"{path}: not an attnres checkpoint (expected a dict with format={FORMAT!r}); "
            "create one with `attnres example` or attnres_export.models.save_checkpoint"
        )
    if payload["format"] != FORMAT:
        raise CheckpointError(f"{path}: format is {payload['format']!r}, expected {FORMAT!r}")
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {payload.get('version')!r} is not supported (this attnres reads {VERSION})"
        )
    for key in ("config", "state_dict"):
        if key not in payload:
            raise CheckpointError(f"{path}: checkpoint has no {key!r} entry")
    if not isinstance(payload["state_dict"], dict):
        raise CheckpointError(f"{path}: 'state_dict' must be a dict of tensors")
    return payload


def _check_sizes_before_building(cfg: Any, state: dict, path: Path) -> None:
    """The config's sizes must match the weights before a model of that size is allocated: a config claiming
    10**6 layers or a 10**9 vocabulary is refused here instead of exhausting memory in the constructor."""
    model_type = architecture(cfg.arch).model_type()
    prefix = model_type.LAYER_PREFIX
    layers = layer_indices(state, prefix)
    if len(layers) != cfg.n_layers or max(layers) != cfg.n_layers - 1:
        past = sorted(key for key in state if (index := layer_index(key, prefix)) is not None and index >= cfg.n_layers)
        raise layer_count_refusal(cfg.n_layers, layers, str(path), past=past[0] if past else None)
    for key, fields in model_type.STATE_SIZE_KEYS.items():
        value = state.get(key)
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{path}: state_dict has no tensor {key!r}, which a {cfg.arch} model needs")
        wanted = [getattr(cfg, name) for name in fields]
        if list(value.shape) != wanted:
            names = ", ".join(f"{n}={w}" for n, w in zip(fields, wanted, strict=True))
            raise CheckpointError(f"{path}: state_dict[{key!r}] has shape {list(value.shape)}, but the config says "
                                  f"{names}; fix the config or the weights")


def _load_state(model: nn.Module, state: dict, path: Path, dtype: str | None,
                reread: Callable[[], dict] | None) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {_few(missing)}")
        if unexpected:
            parts.append(f"unexpected {_few(unexpected)}")
        raise CheckpointError(f"{path}: state_dict does not fit the config ({'; '.join(parts)})")
    for key, ref in expected.items():
        value = state[key]
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{path}: state_dict[{key!r}] is {type(value).__name__}, expected a tensor")
        if value.shape != ref.shape:
            raise CheckpointError(
                f"{path}: state_dict[{key!r}] has shape {list(value.shape)}, the config needs {list(ref.shape)}"
            )
        check_stored_type(f"state_dict[{key!r}]", value, path)
    wanted = _stored_types(model, state, dtype)
    with single_threaded():
        loaded = _checked_and_cast(state, wanted, path, reread)
    model.load_state_dict(loaded, assign=True)
    left = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if left:
        raise CheckpointError(f"{path}: the model has tensors the checkpoint does not set ({_few(left)})")


def _checked_and_cast(state: dict, wanted: dict[str, torch.dtype], path: Path,
                      reread: Callable[[], dict] | None) -> dict[str, torch.Tensor]:
    """Every tensor of ``state`` checked finite and in its ``wanted`` type (cast from a fresh mapping per group
    when a cast is needed, ``CAST_GROUP_BYTES``). Without a mapping to read again, each tensor is taken out of
    ``state`` as it is cast, so a stored tensor that is not mapped (a folder's stacked experts) is freed once its
    cast exists instead of after all of them: a 1B bfloat16 Qwen3-MoE folder exported to float16 peaked at 3.10x
    its weight bytes so and 2.25x after (docs/benchmarks.md)."""
    if reread is None or _held_as(state, wanted):
        return {key: _finite(state.pop(key), key, path).to(wanted[key]) for key in list(state)}
    loaded = {}
    for group in _groups(state):
        source = reread()
        for key in group:
            if source[key].shape != state[key].shape or source[key].dtype != state[key].dtype:
                raise CheckpointError(f"{path}: changed while it was being read; load it again")
            loaded[key] = _finite(source[key], key, path).to(wanted[key], copy=True)
        del source
    return loaded


def _finite(value: torch.Tensor, key: str, path: Path) -> torch.Tensor:
    """``value`` when it holds no NaN or infinity. A finite float32 sum proves it (a NaN or an infinity makes every
    sum NaN or infinite) in one pass and without a mask, several times faster than ``isfinite`` over the weights
    (docs/exporter-notes.md#assembled-export); only a sum that is not finite (such a value, or finite values whose
    sum overflows float32) is checked element by element."""
    if not bool(torch.isfinite(value.sum(dtype=torch.float32))) and not bool(torch.isfinite(value).all()):
        raise CheckpointError(f"{path}: state_dict[{key!r}] holds NaN or infinite values; the weights are "
                              "corrupted (re-save them from a healthy model)")
    return value


def _groups(state: dict) -> list[list[str]]:
    """The state_dict's keys in groups of about ``CAST_GROUP_BYTES`` stored bytes."""
    groups, size = [[]], 0
    for key, value in state.items():
        if size >= CAST_GROUP_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(key)
        size += value.numel() * value.element_size()
    return groups


def _is_pickle_stream(path: Path) -> bool:
    """A file that starts like a pickle (PROTO opcode, protocol 2..5) rather than torch's zip container."""
    with path.open("rb") as handle:
        head = handle.read(2)
    return len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def _few(keys: list[str]) -> str:
    shown = ", ".join(keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
