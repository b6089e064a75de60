"""Refusing external-data references that point outside the model's folder, before anything reads them.

An ONNX file can name, per tensor, a file to read the tensor from. A hostile file could name ``/etc/shadow``,
``../../secret`` or a symlink that leaves the folder, and ONNX Runtime reads a sparse initializer's external
data relative to the current directory rather than the model's (docs/onnx-runtime-notes.md). Every location of
every tensor that can carry external data (initializers, sparse initializers, tensor attributes, in subgraphs
too) must be a relative path that stays inside the model's folder after resolving links.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import onnx

from attnres_export.errors import GraphError

Tensor = tuple[onnx.TensorProto, bool]
"""A tensor, and whether it is part of a sparse tensor."""


def _attribute_tensors(attribute: onnx.AttributeProto) -> Iterator[Tensor]:
    if attribute.HasField("t"):
        yield attribute.t, False
    yield from ((t, False) for t in attribute.tensors)
    for sparse in (*([attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []),
                   *attribute.sparse_tensors):
        yield from ((sparse.values, True), (sparse.indices, True))
    for graph in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
        yield from _graph_tensors(graph)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[Tensor]:
    yield from ((t, False) for t in graph.initializer)
    for sparse in graph.sparse_initializer:
        yield from ((sparse.values, True), (sparse.indices, True))
    for node in graph.node:
        for attribute in node.attribute:
            yield from _attribute_tensors(attribute)


def _model_tensors(model: onnx.ModelProto) -> Iterator[Tensor]:
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            for attribute in node.attribute:
                yield from _attribute_tensors(attribute)


def external_locations(model: onnx.ModelProto) -> list[tuple[str, str, bool]]:
    """(tensor name, location, part of a sparse tensor) of every tensor stored outside the file."""
    found = []
    for tensor, sparse in _model_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            found.append((tensor.name, location, sparse))
    return found


def check_external_data(model: onnx.ModelProto, model_path: Path) -> None:
    """Raise GraphError naming the first external-data location that is absolute, climbs out with ``..``,
    resolves (through links) outside the model's folder, does not exist, or belongs to a sparse tensor."""
    folder = Path(model_path).resolve().parent
    for tensor, location, sparse in external_locations(model):
        where = f"{model_path}: tensor {tensor!r} names external data {location!r}"
        if sparse:
            raise GraphError(f"{where} for a sparse tensor; ONNX Runtime reads those from the current directory "
                             "instead of the model's folder, so attnres refuses them (store sparse tensors inline)")
        relative = Path(location)
        if not location or relative.is_absolute() or ".." in relative.parts or os.path.splitdrive(location)[0]:
            raise GraphError(f"{where}, which is not a plain relative path inside the model's folder; refusing to "
                             "read it (external data must sit beside the .onnx file)")
        target = (folder / relative).resolve()
        if not target.is_relative_to(folder):
            raise GraphError(f"{where}, which resolves to {target} outside the model's folder {folder}; refusing "
                             "to read it (a link out of the folder is not followed)")
        if not target.is_file():
            raise GraphError(f"{where}, which does not exist beside the model; copy the data file next to it")
