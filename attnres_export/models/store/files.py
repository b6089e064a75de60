"""The checkpoint files a store reads, each with its own library's reader: our ``.pt``
(``torch.load(weights_only=True, mmap=True)``: nothing is unpickled but tensors and plain values), a safetensors
file and a sharded folder (``safe_open``, per read).

Pages a memory mapping has read stay resident (and counted in the process's memory) until the mapping is closed,
so no mapping is held open across the whole checkpoint: a safetensors file is opened for each tensor read (its
header is a few kB), and the ``.pt`` payload is mapped again after every ``MAPPED_BYTES`` read through it."""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from pathlib import Path

import torch

from attnres_export.errors import CheckpointError, PickledModelError
from attnres_export.models.folder_files import INDEX_FILE, WEIGHTS_FILE
from attnres_export.models.store.tensors import StoredTensor, check_stored_type

FORMAT = "attnres-checkpoint"
VERSION = 1
MAPPED_BYTES = 256 << 20
"""Bytes read through one mapping of a ``.pt`` file before it is mapped afresh."""
MAX_INDEX_BYTES = 64 << 20
"""A safetensors index lists one line per tensor: a few MB for the largest published models."""


class PtFile:
    """An attnres ``.pt`` checkpoint: ``config`` (plain values) and ``tensors`` by state_dict name."""

    def __init__(self, path: Path) -> None:
        self.path = path
        payload = read_payload(path)
        self.config = payload["config"]
        self._mapped = zipfile.is_zipfile(path)
        self._state: dict | None = payload["state_dict"]
        self._read_since_mapped = 0
        self.tensors: dict[str, StoredTensor] = {}
        for name, value in payload["state_dict"].items():
            where = f"{path}: state_dict[{name!r}]"
            if not isinstance(value, torch.Tensor):
                raise CheckpointError(f"{where} is {type(value).__name__}, expected a tensor")
            check_stored_type(f"state_dict[{name!r}]", value.dtype, path)
            self.tensors[name] = StoredTensor(value.shape, value.dtype, self._reader(name), where)

    def _reader(self, name: str):
        def read() -> torch.Tensor:
            if self._state is None or (self._mapped and self._read_since_mapped >= MAPPED_BYTES):
                self._state = None
                self._state = torch.load(self.path, map_location="cpu", weights_only=True, mmap=True)["state_dict"]
                self._read_since_mapped = 0
            tensor = self._state[name]
            self._read_since_mapped += tensor.numel() * tensor.element_size()
            return tensor

        return read


def read_payload(path: Path) -> dict:
    """The checked ``{"format", "version", "config", "state_dict"}`` of an attnres ``.pt`` (memory-mapped)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file; pass the path of an attnres checkpoint (.pt)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if found is None and not _is_pickle_stream(path):
            raise CheckpointError(f"{path}: not a PyTorch checkpoint (corrupted, or another format)") from exc
        what = f"pickled Python objects ({found.group(1)})" if found else "a raw pickle stream"
        refusal = PickledModelError if found else CheckpointError  # a whole object the foreign exporter may unpickle
        raise refusal(
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


def safetensors_tensors(folder: Path) -> dict[str, StoredTensor]:
    """The tensors of ``model.safetensors`` or of the shards an index lists (file names confined to the folder),
    read from their headers only."""
    if (folder / INDEX_FILE).is_file():
        index_file = folder / INDEX_FILE
        if index_file.stat().st_size > MAX_INDEX_BYTES:
            raise CheckpointError(f"{index_file}: over {MAX_INDEX_BYTES >> 20} MB; not a safetensors index")
        try:
            weight_map = json.loads(index_file.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{index_file}: not a safetensors index ({exc})") from exc
        for name in files:
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                raise CheckpointError(f"{index_file}: shard {name!r} is not a file name inside the folder")
        tensors: dict[str, StoredTensor] = {}
        for name in files:
            part = file_tensors(folder / name)
            wanted = {k for k, v in weight_map.items() if v == name}
            if set(part) != wanted:
                extra = sorted(set(part) ^ wanted)[:3]
                raise CheckpointError(f"{folder / name}: its tensors differ from what {INDEX_FILE} lists ({extra})")
            tensors |= part
        return tensors
    if (folder / WEIGHTS_FILE).is_file():
        return file_tensors(folder / WEIGHTS_FILE)
    raise CheckpointError(f"{folder}: no {WEIGHTS_FILE} and no {INDEX_FILE}")


def file_tensors(file: Path) -> dict[str, StoredTensor]:
    """The tensors of one safetensors file, from its header; each read opens the file for that tensor only. Their
    types are checked by the caller (``check_stored_types``), after a quantized checkpoint's parts have been joined
    into weights (``models.store.quantized``)."""
    from safetensors import SafetensorError, safe_open

    if not file.is_file():
        raise CheckpointError(f"{file}: no such shard")
    try:
        with safe_open(str(file), framework="pt") as handle:
            slices = {name: handle.get_slice(name) for name in handle.keys()}  # noqa: SIM118 (not a dict)
            headers = {name: (part.get_shape(), part.get_dtype()) for name, part in slices.items()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{file}: not a readable safetensors file ({str(exc).splitlines()[0][:200]})") from exc
    tensors = {}
    for name, (shape, stored) in headers.items():
        dtype = _SAFETENSORS_TYPES.get(stored)
        if dtype is None:
            raise CheckpointError(f"{file}: {name} is stored as {stored}, a type attnres does not read (convert the "
                                  "checkpoint to float32, float16 or bfloat16)")
        tensors[name] = StoredTensor(shape, dtype, _safetensors_reader(file, name), f"{file}: {name}")
    return tensors


def _safetensors_reader(file: Path, name: str):
    def read() -> torch.Tensor:
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(file), framework="pt") as handle:
                return handle.get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{file}: {name} is not readable ({str(exc).splitlines()[0][:200]}); was the file "
                                  "changed while it was being read?") from exc

    return read


_SAFETENSORS_TYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
"""safetensors' dtype names (its header) and the torch types they read as."""


def _is_pickle_stream(path: Path) -> bool:
    """A file that starts like a pickle (PROTO opcode, protocol 2..5) rather than torch's zip container."""
    with path.open("rb") as handle:
        head = handle.read(2)
    return len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
