"""Checkpoint read/write (docs/models.md#checkpoint-format), loaded with ``weights_only=True``: no code runs on load."""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path

import torch
from torch import nn

from attnres_export.atomic import atomic_write
from attnres_export.errors import CheckpointError
from attnres_export.models.config import ModelConfig

FORMAT = "attnres-checkpoint"
VERSION = 1


def build_model(cfg: ModelConfig) -> nn.Module:
    """The reference model for ``cfg.arch``."""
    if cfg.arch == "attnres-lm":
        from attnres_export.models.attnres_lm import AttnResLM

        return AttnResLM(cfg)
    from attnres_export.models.realformer import RealFormer

    return RealFormer(cfg)


def save_checkpoint(model: nn.Module, cfg: ModelConfig, path: Path) -> None:
    """Write ``{"format", "version", "config", "state_dict"}`` atomically."""
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "config": cfg.to_dict(),
        "state_dict": {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
    }
    with atomic_write(Path(path)) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(path: Path) -> tuple[nn.Module, ModelConfig]:
    """Load a checkpoint into a float32 model in eval mode; any other file is refused with one line."""
    path = Path(path)
    payload = _read_payload(path)
    cfg = ModelConfig.from_dict(payload["config"])
    model = build_model(cfg)
    _load_state(model, payload["state_dict"], path)
    return model.eval(), cfg


def _read_payload(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file; pass the path of an attnres checkpoint (.pt)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if found is None:
            raise CheckpointError(f"{path}: not a PyTorch checkpoint (corrupted, or another format)") from exc
        raise CheckpointError(
            f"{path}: holds pickled Python objects ({found.group(1)}), which attnres does not unpickle since "
            "that can run arbitrary code; save {'format', 'version', 'config', 'state_dict'} "
            "(docs/models.md#checkpoint-format) "
            "(attnres_export.models.save_checkpoint)"
        ) from exc
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable PyTorch file ({_first_line(exc)}); is it corrupted?") from exc
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


def _load_state(model: nn.Module, state: dict, path: Path) -> None:
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
        if not value.is_floating_point():
            raise CheckpointError(f"{path}: state_dict[{key!r}] is {value.dtype}, expected a floating-point tensor")
    model.load_state_dict({k: v.float() for k, v in state.items()})


def _few(keys: list[str]) -> str:
    shown = ", ".join(keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
