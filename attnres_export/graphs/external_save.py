"""Saving a model with its weights in an external-data file without copying the model.

``onnx.save_model(save_as_external_data=True)`` moves the weights out of the proto it is given, so callers that
keep the model must save a full copy: for a multi-GB model that is the weights held twice. Here the weights are
streamed to the data file one tensor at a time and a weightless copy that references them is written."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import numpy_helper

from attnres_export.graphs.onnx_utils import copy_without_weights

ALIGNMENT = 4096
"""Tensors start on page boundaries, so ONNX Runtime can map them instead of copying."""


def save_with_external_data(model: onnx.ModelProto, path: Path, data_name: str, size_threshold: int = 1024) -> None:
    """Write ``model`` to ``path``, every main-graph initializer over ``size_threshold`` bytes in ``data_name``
    (a file beside ``path``); ``model`` is not modified."""
    path = Path(path)
    with (path.parent / data_name).open("wb") as data:
        def to_file(init: onnx.TensorProto, graph: onnx.GraphProto) -> None:
            if init.data_type == onnx.TensorProto.STRING:
                graph.initializer.add().CopyFrom(init)
                return
            payload = init.raw_data if init.HasField("raw_data") else numpy_helper.to_array(init).tobytes()
            offset = -data.tell() % ALIGNMENT + data.tell()
            data.seek(offset)
            data.write(payload)
            stub = graph.initializer.add()
            stub.name, stub.data_type = init.name, init.data_type
            stub.dims.extend(init.dims)
            stub.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(len(payload)))):
                entry = stub.external_data.add()
                entry.key, entry.value = key, value

        weightless = copy_without_weights(model, size_threshold, to_file)
    onnx.save_model(weightless, str(path))
