"""Hostile files, made inside the tests (never shipped): pickles whose loading would create a marker file."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from pathlib import Path

import torch


class TouchOnLoad:
    """Unpickling this creates ``marker``: proof that code from the file ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def pickle_bytes(marker: Path) -> bytes:
    return pickle.dumps(TouchOnLoad(marker))


class TinyProgram(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(x), dim=-1)


def save_program(path: Path) -> Path:
    torch.export.save(torch.export.export(TinyProgram().eval(), (torch.randn(2, 4),)), path)
    return path


def rewrite_archive(source: Path, target: Path, edit) -> Path:
    """Copy the zip ``source`` to ``target`` with ``edit(name, data) -> data`` applied to every member."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as out:
        for info in original.infolist():
            out.writestr(info, edit(info.filename, original.read(info.filename)))
    return target


def with_pickled_weight(program: Path, target: Path, marker: Path) -> Path:
    """A .pt2 whose weights config says ``use_pickle`` for one weight, whose file is a code-running pickle."""
    def edit(name: str, data: bytes) -> bytes:
        if name.endswith("_weights_config.json"):
            config = json.loads(data)
            first = next(iter(config["config"].values()))
            first["use_pickle"] = True
            return json.dumps(config).encode()
        if name.endswith("/data/weights/weight_0"):
            return pickle_bytes(marker)
        return data

    return rewrite_archive(program, target, edit)


def with_pickled_sample_inputs(program: Path, target: Path, marker: Path) -> Path:
    """A .pt2 whose sample inputs need full unpickling (torch falls back to ``weights_only=False`` for them)."""
    def edit(name: str, data: bytes) -> bytes:
        if "/data/sample_inputs/" in name:
            buffer = io.BytesIO()
            torch.save(((TouchOnLoad(marker),), {}), buffer)
            return buffer.getvalue()
        return data

    return rewrite_archive(program, target, edit)
