"""Checkpoint read/write (docs/models.md#checkpoint-format), loaded with ``weights_only=True``: no code runs on load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnres_export.atomic import atomic_write
from attnres_export.models.registry import build_model
from attnres_export.models.store import held_types, open_checkpoint
from attnres_export.models.store.files import FORMAT, VERSION


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
    with one line. A command that needs the checkpoint more than once opens it once (``models.store``).

    Weights are held in ``dtype`` (``None``: as stored), except that the aggregation and rotary tensors are never
    below float32 (``KeepFloat32``). The model is built without allocating weights, and a tensor already in its
    type is used as read (memory-mapped from a ``.pt``): loading holds the weights once."""
    checkpoint = open_checkpoint(Path(path))
    return checkpoint.model(dtype), checkpoint.config


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
    """The type each state_dict entry is held in (``models.store.held_types``)."""
    return held_types(model, {key: tensor.dtype for key, tensor in state.items()}, dtype)
