"""Inspecting a torch.export archive (.pt2) before ``torch.export.load`` touches it.

``torch.export.load`` unpickles with full ``pickle`` (code runs) in several places (torch 2.13,
``torch/export/pt2_archive/_package.py`` and ``torch/_export/serde/serialize.py``): weights and tensor constants
whose config says ``use_pickle``, ``custom_obj_*``/``opaque_obj_*`` constants, and the sample inputs, which fall
back to ``weights_only=False`` when the safe load fails; archives of the pre-2.8 layout are pickles throughout,
and ``data/aotinductor/`` holds compiled code. This module reads the archive as a zip and names every such
member, so that a file is loaded only when nothing in it needs unpickling (or the user said they trust it).
"""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from pathlib import Path

import torch

from attnres_export.errors import ExportError

NOT_A_PROGRAM = ("not a torch.export program; write one with "
                 "torch.export.save(torch.export.export(model, args), 'model.pt2')")
PICKLED_CONSTANT_PREFIXES = ("custom_obj_", "opaque_obj_")
COMPILED_DIRS = ("data/aotinductor/", "data/executorch/", "data/mtia")


def unsafe_members(path: Path) -> list[str]:
    """Members of the archive at ``path`` that ``torch.export.load`` would unpickle or run, with the reason;
    ExportError when the file is no torch.export archive at all."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ExportError(f"{path}: {NOT_A_PROGRAM} (not a zip archive: {exc})") from exc
    with archive:
        names = archive.namelist()
        if any(name.endswith("serialized_exported_program.json") for name in names):
            return ["the whole file (an archive of the pre-2.8 torch.export layout, which is pickled throughout)"]
        roots = {name.split("/", 1)[0] for name in names if "/" in name}
        root = f"{next(iter(roots))}/" if len(roots) == 1 else ""
        members = {name[len(root):]: name for name in names if root and name.startswith(root)}
        if _read(archive, members.get("archive_format")) != b"pt2":
            raise ExportError(f"{path}: {NOT_A_PROGRAM}")
        found = [f"{members[m]} (compiled code)" for m in members if m.startswith(COMPILED_DIRS)]
        for config_name in (m for m in members if m.endswith(("_weights_config.json", "_constants_config.json"))):
            found += _pickled_payloads(archive, members, config_name)
        for inputs in (m for m in members if m.startswith("data/sample_inputs/")):
            found += _unsafe_sample_inputs(archive, members[inputs])
    return found


def _read(archive: zipfile.ZipFile, name: str | None) -> bytes | None:
    return archive.read(name).strip() if name else None


def _pickled_payloads(archive: zipfile.ZipFile, members: dict[str, str], config_name: str) -> list[str]:
    folder = config_name.rsplit("/", 1)[0] + "/"
    try:
        config = json.loads(archive.read(members[config_name]))["config"]
    except (ValueError, KeyError, TypeError):
        return [f"{members[config_name]} (unreadable payload config)"]
    found = []
    for fqn, meta in config.items():
        path_name = str(meta.get("path_name", "")) if isinstance(meta, dict) else ""
        if not isinstance(meta, dict) or meta.get("use_pickle") or path_name.startswith(PICKLED_CONSTANT_PREFIXES):
            found.append(f"{members.get(folder + path_name, folder + path_name)} ({fqn!r} is pickled)")
    return found


def _unsafe_sample_inputs(archive: zipfile.ZipFile, name: str) -> list[str]:
    """torch retries a failed safe load of the sample inputs with full unpickling; try the safe load here."""
    data = archive.read(name)
    if not data:
        return []
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as exc:
        return [f"{name} (example inputs that need full unpickling: {str(exc).splitlines()[0][:120]})"]
    return []
