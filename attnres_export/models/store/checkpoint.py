"""An opened checkpoint: its typed config and its tensors by our state_dict names, read one at a time.

A command opens its checkpoint once (``open_checkpoint``) and asks it for what it needs: a model in a dtype
(``model``), a model whose large tensors stay in the file until an export writes them (``streamed_model``), the
model's fingerprint (``fingerprint``). Nothing but the config and the tensors' headers is read when it opens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnres_export.dtypes import torch_dtype
from attnres_export.errors import CheckpointError
from attnres_export.models.base import KeepFloat32, matmul_weight_names, weights_fingerprint
from attnres_export.models.limits import layer_count_refusal, layer_index, layer_indices
from attnres_export.models.registry import architecture, build_model, config_from_dict
from attnres_export.models.store.files import PtFile
from attnres_export.models.store.quantized import QuantizedTensor
from attnres_export.models.store.quantized.rtn import rtn_quantized
from attnres_export.models.store.tensors import StoredTensor
from attnres_export.models.threads import single_threaded

RESIDENT_BYTES = 1 << 20
"""A streamed model holds every vector (norm and aggregation weights, biases: the export plan folds some of them)
and every tensor up to this size in memory; larger ones stay in the file until written."""


@dataclass
class Checkpoint:
    """One checkpoint, opened once per command."""

    path: Path
    config: Any
    """The family config (typed)."""
    tensors: dict[str, StoredTensor]
    """By the model's state_dict names (a folder's family view: renamed, experts stacked, narrowed)."""
    _fingerprint: str | None = field(default=None, repr=False)

    def model(self, dtype: str | None = "float32") -> nn.Module:
        """The model in eval mode, its weights in ``dtype`` (``None``: as stored), except that ``KeepFloat32``
        tensors are never below float32. A tensor already in its type is used as read (a ``.pt`` stays mapped)."""
        model = _meta_model(self.config)
        wanted = _held_types(model, self.tensors, dtype)
        read: dict[tuple[int, torch.dtype], torch.Tensor] = {}  # one per stored tensor: a tied head stays tied
        with single_threaded():
            state = {}
            for name, stored in self.tensors.items():
                key = (id(stored), wanted[name])
                if key not in read:
                    read[key] = stored.read(wanted[name])
                state[name] = read[key]
        model.load_state_dict(state, assign=True)
        return model.eval()

    def streamed_model(self, dtype: str) -> StreamedModel:
        """The model with its matrices over ``RESIDENT_BYTES`` and its quantized weights left on the meta device in
        their ``dtype`` type (read from the file when an export writes them, ``StreamedModel.read``); vectors and
        smaller tensors in memory."""
        model = _meta_model(self.config)
        wanted = _held_types(model, self.tensors, dtype)
        state = {}
        with single_threaded():
            for name, stored in self.tensors.items():
                if not isinstance(stored, QuantizedTensor) and (
                        _is_vector(stored) or stored.numel() * wanted[name].itemsize <= RESIDENT_BYTES):
                    state[name] = stored.read(wanted[name])
                else:
                    state[name] = torch.empty(stored.shape, dtype=wanted[name], device="meta")
        model.load_state_dict(state, assign=True)
        by_id = {id(tensor): name
                 for name, tensor in [*model.named_parameters(remove_duplicate=False),
                                      *model.named_buffers(remove_duplicate=False)]
                 if tensor.is_meta and name in self.tensors}
        return StreamedModel(model.eval(), lambda tensor: self._read_meta(by_id, tensor),
                             lambda tensor: self.tensors.get(by_id.get(id(tensor), "")))

    def _read_meta(self, names: dict[int, str], tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_meta:
            return tensor
        if id(tensor) not in names:
            raise CheckpointError(f"{self.path}: an export asked for a tensor that is not one of the model's "
                                  "(please report this)")
        return self.tensors[names[id(tensor)]].read(tensor.dtype)

    def quantized_on_read(self, bits: int, block_size: int | None, embeddings: bool) -> Checkpoint:
        """This checkpoint with its float matmul weights (``models.base.matmul_weight_names``) quantized by
        round-to-nearest as they are read (``--quantize``; ``block_size`` None: per channel); weights stored
        quantized stay as published."""
        tensors = dict(self.tensors)
        for name in matmul_weight_names(_meta_model(self.config), embeddings):
            stored = tensors.get(name)
            if stored is not None and not isinstance(stored, QuantizedTensor):
                tensors[name] = rtn_quantized(stored, bits, block_size, stored.where)
        if all(tensors[name] is stored for name, stored in self.tensors.items()):
            return self
        return Checkpoint(self.path, self.config, tensors, self.fingerprint())

    def quantized_formats(self) -> dict[str, int]:
        """How many weights are stored in each quantized format (empty for a float checkpoint)."""
        counts: dict[str, int] = {}
        for stored in self.tensors.values():
            if isinstance(stored, QuantizedTensor):
                counts[stored.format] = counts.get(stored.format, 0) + 1
        return counts

    def fingerprint(self) -> str:
        """``models.base.fingerprint`` of the model, read one tensor at a time."""
        if self._fingerprint is None:
            self._fingerprint = weights_fingerprint(
                self.config, {name: (stored.shape, stored.read) for name, stored in self.tensors.items()})
        return self._fingerprint


@dataclass
class StreamedModel:
    """A model whose large tensors are on the meta device, and how to read one of them from the checkpoint."""

    module: nn.Module
    read: Callable[[torch.Tensor], torch.Tensor]
    """The values of one of the module's tensors (the tensor itself when it is not on the meta device)."""
    stored: Callable[[torch.Tensor], StoredTensor | None]
    """The stored tensor a meta tensor of the module reads (a ``QuantizedTensor`` for a quantized weight, which is
    always left on the meta device, so that an export can keep it quantized); None for a tensor in memory."""


def open_checkpoint(path: Path) -> Checkpoint:
    """Open a checkpoint (a ``.pt`` file, or a folder with config.json and safetensors weights: our own layout or a
    family's Hugging Face layout, docs/models.md#checkpoint-folders); anything else is refused with one line. The
    config's sizes are checked against the tensors' headers, and the tensors' names and shapes against the model,
    before any weight is read."""
    path = Path(path)
    if path.is_dir():
        from attnres_export.models.hf_folder import read_folder

        cfg, tensors = read_folder(path)
    else:
        file = PtFile(path)
        cfg, tensors = config_from_dict(file.config), file.tensors
    _check_sizes_before_building(cfg, tensors, path)
    _check_fits(_meta_model(cfg), tensors, path)
    return Checkpoint(path, cfg, tensors)


def _is_vector(stored: StoredTensor) -> bool:
    """At most one dimension over 1 (``[D]``, a pseudo-query ``[1, D]``, ``A_log`` ``[1, 1, H, 1]``)."""
    return stored.numel() == max(stored.shape, default=1)


def _meta_model(cfg: Any) -> nn.Module:
    with torch.device("meta"):
        return build_model(cfg)


def _held_types(model: nn.Module, tensors: dict[str, StoredTensor], dtype: str | None) -> dict[str, torch.dtype]:
    return held_types(model, {name: stored.dtype for name, stored in tensors.items()}, dtype)


def held_types(model: nn.Module, stored: dict[str, torch.dtype], dtype: str | None) -> dict[str, torch.dtype]:
    """The type each state_dict entry (``stored``: its type as stored) is held in: ``dtype`` (or as stored), at
    least float32 under ``KeepFloat32``."""
    keep = keep_float32_names(model)
    types = {}
    for name, stored_type in stored.items():
        held = stored_type if dtype is None else torch_dtype(dtype)
        types[name] = torch.promote_types(held, torch.float32) if name in keep else held
    return types


def keep_float32_names(model: nn.Module) -> set[str]:
    """State_dict names of the ``KeepFloat32`` tensors (aggregation weights, rotary tables)."""
    return {f"{prefix}.{name}" if prefix else name
            for prefix, module in model.named_modules() if isinstance(module, KeepFloat32)
            for name in module.float32_state_names()}


def _check_sizes_before_building(cfg: Any, tensors: dict[str, StoredTensor], path: Path) -> None:
    """The config's sizes must match the weights before a model of that size is built: a config claiming
    10**6 layers or a 10**9 vocabulary is refused here instead of exhausting memory in the constructor."""
    model_type = architecture(cfg.arch).model_type()
    prefix = model_type.LAYER_PREFIX
    layers = layer_indices(tensors, prefix)
    if len(layers) != cfg.n_layers or max(layers) != cfg.n_layers - 1:
        past = sorted(key for key in tensors if (index := layer_index(key, prefix)) is not None
                      and index >= cfg.n_layers)
        raise layer_count_refusal(cfg.n_layers, layers, str(path), past=past[0] if past else None)
    for key, fields in model_type.STATE_SIZE_KEYS.items():
        value = tensors.get(key)
        if value is None:
            raise CheckpointError(f"{path}: state_dict has no tensor {key!r}, which a {cfg.arch} model needs")
        wanted = [getattr(cfg, name) for name in fields]
        if list(value.shape) != wanted:
            names = ", ".join(f"{n}={w}" for n, w in zip(fields, wanted, strict=True))
            raise CheckpointError(f"{path}: state_dict[{key!r}] has shape {list(value.shape)}, but the config says "
                                  f"{names}; fix the config or the weights")


def _check_fits(model: nn.Module, tensors: dict[str, StoredTensor], path: Path) -> None:
    """Every tensor the model has is given, in its shape, and nothing else."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {_few(missing)}")
        if unexpected:
            parts.append(f"unexpected {_few(unexpected)}")
        raise CheckpointError(f"{path}: state_dict does not fit the config ({'; '.join(parts)})")
    for key, ref in expected.items():
        if tensors[key].shape != ref.shape:
            raise CheckpointError(f"{path}: state_dict[{key!r}] has shape {list(tensors[key].shape)}, the config "
                                  f"needs {list(ref.shape)}")
    left = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()]
            if name not in expected and tensor.is_meta]
    if left:
        raise CheckpointError(f"{path}: the model has tensors the checkpoint does not set ({_few(left)})")


def _few(keys: list[str]) -> str:
    shown = ", ".join(keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
