"""Building an export in a private folder beside its destination, with the weights on disk from the start.

A multi-GB model cannot be held several times over (docs/benchmarks.md, "CPU: export memory"): the traced model's
weights stream once to an external-data file in the folder, and everything after the trace (metadata, target
conversion, validation, the parity run) works on the graph without its weights. ``publish`` moves the result
into place, inlining the weights when the model is small enough for one file; an interrupted run leaves only
the private folder, which the next run to the same path removes.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx_ir as ir

from attnres_export.atomic import atomic_write, default_file_mode, refuse_non_regular
from attnres_export.graphs.external_save import ALIGNMENT
from attnres_export.graphs.onnx_utils import fits_in_one_file
from attnres_export.graphs.save import check_written
from attnres_export.graphs.schemas import register_schemas

IN_FLIGHT_BYTES = 64 << 20
"""At most this much tensor data is being written at once."""


class Stage:
    """``folder/name`` and its ``.data`` file: the export being built."""

    def __init__(self, folder: Path, name: str) -> None:
        self.path = Path(folder) / name
        self.data_name = name + ".data"

    def write_traced(self, model: ir.Model) -> onnx.ModelProto:
        """Write the traced ``model`` with every initializer in the data file; return its graph, weightless."""
        ir.save(model, self.path, external_data=self.data_name, size_threshold_bytes=1024, alignment=ALIGNMENT,
                align_threshold=ALIGNMENT, max_workers=1, max_in_flight_bytes=IN_FLIGHT_BYTES)
        return onnx.load(str(self.path), load_external_data=False)

    def write_graph(self, graph: onnx.ModelProto) -> None:
        """Replace the staged graph by ``graph`` (weightless, referencing the same data file)."""
        onnx.save_model(graph, str(self.path))

    def publish(self, target: Path) -> list[Path]:
        """Check the staged model with ``onnx.checker`` and move it to ``target`` (with ``target.data`` when it is
        over protobuf's limit, else as one file); returns the files written."""
        register_schemas()
        refuse_non_regular(target, "output")
        data = self.path.parent / self.data_name
        if fits_in_one_file(data.stat().st_size + self.path.stat().st_size):
            check_written(self.path, target.name)
            with atomic_write(target) as tmp:
                _write_inline(onnx.load(str(self.path), load_external_data=False), data, tmp)
            return [target]
        target_data = target.parent / (target.name + ".data")
        refuse_non_regular(target_data, "external data file")
        graph = onnx.load(str(self.path), load_external_data=False)
        _relocate(graph, self.data_name, target_data.name)
        staged_data = self.path.parent / target_data.name
        os.replace(data, staged_data)
        self.data_name = target_data.name
        self.write_graph(graph)
        check_written(self.path, target.name)
        for produced in (staged_data, self.path):
            os.chmod(produced, default_file_mode())
        os.replace(staged_data, target_data)
        os.replace(self.path, target)
        return [target, target_data]



def _relocate(graph: onnx.ModelProto, old: str, new: str) -> None:
    for init in graph.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location" and entry.value == old:
                entry.value = new


def _write_inline(graph: onnx.ModelProto, data: Path, out: Path) -> None:
    """Write ``graph`` with its external initializers read back into one ``.onnx``, a tensor at a time.

    protobuf's serializer holds a message about three times over while encoding it, so the weights are not put
    back into the proto: the weightless model is encoded, then a second ``graph`` field holding only the
    initializers is appended. A parser merges repeated occurrences of a message field (the protobuf encoding
    rules), so the file reads as one model with every initializer inline."""
    stubs = [init for init in graph.graph.initializer if init.data_location == onnx.TensorProto.EXTERNAL]
    kept = [init for init in graph.graph.initializer if init.data_location != onnx.TensorProto.EXTERNAL]
    del graph.graph.initializer[:]
    graph.graph.initializer.extend(kept)
    entries = []
    for stub in stubs:
        info = {entry.key: entry.value for entry in stub.external_data}
        meta = onnx.TensorProto(name=stub.name, data_type=stub.data_type, dims=stub.dims)
        length = int(info["length"])
        head = meta.SerializeToString() + _RAW_DATA_TAG + _varint(length)
        entries.append((head, int(info.get("offset", 0)), length))
    body = sum(len(_INITIALIZER_TAG) + len(_varint(len(h) + n)) + len(h) + n for h, _, n in entries)
    with out.open("wb") as sink, data.open("rb") as source:
        sink.write(graph.SerializeToString())
        sink.write(_GRAPH_TAG + _varint(body))
        for head, offset, length in entries:
            sink.write(_INITIALIZER_TAG + _varint(len(head) + length) + head)
            source.seek(offset)
            sink.write(source.read(length))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _tag(field: int) -> bytes:
    """The key of a length-delimited field (wire type 2)."""
    return _varint(field << 3 | 2)


_GRAPH_TAG = _tag(onnx.ModelProto.GRAPH_FIELD_NUMBER)
_INITIALIZER_TAG = _tag(onnx.GraphProto.INITIALIZER_FIELD_NUMBER)
_RAW_DATA_TAG = _tag(onnx.TensorProto.RAW_DATA_FIELD_NUMBER)
