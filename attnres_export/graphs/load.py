"""The one way an ONNX file is read: a missing, unreadable or non-ONNX file, external data outside the model's
folder, and an attnres node that breaks the op-set contract are refused with one line before any other code
sees the model."""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from attnres_export.errors import GraphError
from attnres_export.graphs.external_data import check_external_data, external_locations


def load_onnx(path: Path, load_external_data: bool = True) -> onnx.ModelProto:
    """Load and validate the ONNX model at ``path``."""
    path = Path(path)
    if not path.is_file():
        raise GraphError(f"{path}: no such file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, OSError, ValueError, RuntimeError) as exc:
        raise GraphError(f"{path}: not a readable ONNX model ({type(exc).__name__}); is it corrupted?") from exc
    if not model.graph.node and not model.graph.output:
        raise GraphError(f"{path}: not an ONNX model (no graph in it); pass a .onnx file written by an exporter")
    check_external_data(model, path)
    if load_external_data and external_locations(model):
        try:
            onnx.load_external_data_for_model(model, str(path.resolve().parent))
        except (OSError, ValueError, RuntimeError) as exc:
            raise GraphError(f"{path}: its external data could not be read ({_first_line(exc)})") from exc
    from attnres_export.graphs.validate import validate_attnres_nodes

    validate_attnres_nodes(model, str(path))
    return model


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else type(exc).__name__
