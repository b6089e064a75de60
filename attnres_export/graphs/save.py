"""Atomic, checked ONNX saving, with external data for models over protobuf's 2 GB limit."""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from attnres_export.atomic import default_file_mode, refuse_non_regular, temporary_dir_beside
from attnres_export.errors import ExportError
from attnres_export.graphs.external_save import save_with_external_data
from attnres_export.graphs.onnx_utils import needs_external_data
from attnres_export.graphs.schemas import register_schemas


def save_onnx_atomic(model: onnx.ModelProto, path: Path) -> list[Path]:
    """Write ``path`` (and ``path.data`` when large) after a full ``onnx.checker`` pass on the written file.

    ``model`` is not modified, nor copied: with external data its weights stream to the data file.
    Everything is written to a temporary folder beside ``path``; the .onnx is renamed into place last, so an
    interrupted run never leaves a partial model, and an invalid model is never put in place.
    """
    register_schemas()
    path = Path(path)
    refuse_non_regular(path, "output")
    refuse_non_regular(path.parent / (path.name + ".data"), "external data file")
    with temporary_dir_beside(path) as tmp_dir:
        tmp = tmp_dir / path.name
        external = needs_external_data(model)
        data_name = path.name + ".data"
        if external:
            save_with_external_data(model, tmp, data_name)
        else:
            onnx.save_model(model, str(tmp))
        check_written(tmp, path.name)
        written = [path]
        for produced in tmp_dir.iterdir():
            os.chmod(produced, default_file_mode())
        if external:
            os.replace(tmp_dir / data_name, path.parent / data_name)
            written.append(path.parent / data_name)
        os.replace(tmp, path)
    return written


def check_written(file: Path, name: str) -> None:
    """The full ``onnx.checker`` on a written (not yet published) ``file``; ``name`` is what the user asked for."""
    try:
        onnx.checker.check_model(str(file), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        first = str(exc).strip().splitlines()[0][:300]
        raise ExportError(f"{name} would not pass onnx.checker ({first}); nothing was written") from exc
