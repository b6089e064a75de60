"""Building an export in a private folder beside its destination, with the weights on disk from the start.

A multi-GB model cannot be held several times over (docs/benchmarks.md, "CPU: export memory"): the traced model's
weights stream once to an external-data file in the folder, and everything after the trace (metadata, target
conversion, validation, the parity run) works on the graph without its weights. ``publish`` moves the result
into place; an interrupted run leaves only the private folder, which the next run to the same path removes.

A model small enough for one file has its weights written once, in their final place: the data file is laid out
as the start of the one-file model (``_write_framed``), each tensor's bytes wrapped in the protobuf framing of a
``graph.initializer`` and referenced by the staged graph at its offset, so that publishing appends the weightless
graph and renames the file (docs/exporter-notes.md#weights-io). A larger model's data file is page-aligned.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import onnx
import onnx_ir as ir
import torch
from onnx_ir.tensor_adapters import TorchTensor

from attnres_export.atomic import default_file_mode, refuse_non_regular
from attnres_export.errors import ExportError
from attnres_export.exporter.graph_proto import serialize_assembled
from attnres_export.graphs.external_save import ALIGNMENT
from attnres_export.graphs.onnx_utils import fits_in_one_file
from attnres_export.graphs.protobuf_wire import length_delimited_tag, varint
from attnres_export.graphs.save import check_written
from attnres_export.graphs.schemas import register_schemas
from attnres_export.models.threads import single_threaded

IN_FLIGHT_BYTES = 64 << 20
"""At most this much tensor data is being written at once."""


class Stage:
    """``folder/name`` and its ``.data`` file: the export being built."""

    def __init__(self, folder: Path, name: str) -> None:
        self.path = Path(folder) / name
        self.data_name = name + ".data"
        self.framed = False
        """Is the data file the start of the one-file model (``_write_framed``)?"""

    def write_traced(self, model: ir.Model) -> onnx.ModelProto:
        """Write the traced ``model`` with every initializer in the data file; return its graph, weightless. Framed,
        ``model``'s initializers are left referencing the data file: the caller's tensors are no longer held."""
        data = self.path.parent / self.data_name
        with single_threaded():
            if not fits_in_one_file(_framed_size(_main_initializers(model))):
                ir.save(model, self.path, external_data=self.data_name, size_threshold_bytes=EXTERNAL_BYTES,
                        alignment=ALIGNMENT, align_threshold=ALIGNMENT, max_workers=1,
                        max_in_flight_bytes=IN_FLIGHT_BYTES)
                return onnx.load(str(self.path), load_external_data=False)
            _write_framed(model, data)
        self.framed = True
        graph = serialize_assembled(model)
        onnx.save_model(graph, str(self.path))
        return graph

    def write_graph(self, graph: onnx.ModelProto) -> None:
        """Replace the staged graph by ``graph`` (weightless, referencing the same data file)."""
        onnx.save_model(graph, str(self.path))

    def publish(self, target: Path) -> list[Path]:
        """Check the staged model with ``onnx.checker`` and move it to ``target``: as one file when its weights were
        framed for it and the whole is under protobuf's limit, else with ``target.data``; returns the files
        written."""
        register_schemas()
        refuse_non_regular(target, "output")
        data = self.path.parent / self.data_name
        if self.framed and fits_in_one_file(data.stat().st_size + self.path.stat().st_size):
            check_written(self.path, target.name)
            _append_graph(onnx.load(str(self.path), load_external_data=False), data)
            os.chmod(data, default_file_mode())
            os.replace(data, target)
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


EXTERNAL_BYTES = 1024
"""Initializers of at least this many bytes go to the data file; smaller ones stay in the graph."""


def _main_initializers(model: ir.Model) -> list[ir.Value]:
    """The main graph's initializers that go to the data file (a subgraph's stay in its graph: the one-file layout
    can only append to the main graph's initializer list)."""
    return [value for value in model.graph.initializers.values()
            if value.const_value is not None and not isinstance(value.const_value, ir.ExternalTensor)
            and value.const_value.dtype != ir.DataType.STRING and value.const_value.nbytes >= EXTERNAL_BYTES]


def _framed_size(values: list[ir.Value]) -> int:
    """An upper bound of the data file ``_write_framed`` writes for ``values``: their bytes and each one's framing
    (its name, type and dims as a TensorProto, and three tags with lengths of at most 10 bytes each)."""
    return sum(value.const_value.nbytes + len((value.name or "").encode()) + 16 * len(value.const_value.shape) + 64
               for value in values)


class ComputedTensor(ir.LazyTensor):
    """A tensor computed from the model's weights when it is written (a transposed ``nn.Linear`` weight):
    ``compute`` returns it as a torch tensor, often a strided view, which the framed writer copies into one buffer
    it reuses for every such tensor, where a contiguous copy per tensor would fault in fresh pages each time
    (docs/exporter-notes.md#weights-io)."""

    __slots__ = ("compute",)

    def __init__(self, compute: Callable[[], torch.Tensor], dtype: ir.DataType, shape: ir.Shape, name: str) -> None:
        super().__init__(lambda: TorchTensor(compute().contiguous(), name=name), dtype=dtype, shape=shape, name=name)
        self.compute = compute


class _Scratch:
    """The buffer ``ComputedTensor`` values are computed into, grown to the largest of them."""

    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)

    def holding(self, value: torch.Tensor) -> memoryview:
        """``value``'s bytes, copied contiguously into the buffer (valid until the next call)."""
        size = value.numel() * value.element_size()
        if self.buffer.numel() < size:
            self.buffer = torch.empty(size, dtype=torch.uint8)
        self.buffer[:size].view(value.dtype).view(value.shape).copy_(value)
        return memoryview(self.buffer[:size].numpy())


def _write_framed(model: ir.Model, data: Path) -> None:
    """Write the main graph's large initializers to ``data`` as ``graph { initializer { name, type, dims, raw_data }
    }`` fields of a ModelProto, one such field per tensor, and point each initializer at its bytes there.

    A parser merges repeated occurrences of a message field (the protobuf encoding rules), so these fields followed
    by the weightless model (``_append_graph``) read as one model with every initializer inline, while the staged
    graph reads the same bytes as external data at their offsets."""
    values = _main_initializers(model)
    scratch = _Scratch()
    with data.open("wb") as sink:
        for value in values:
            tensor = value.const_value
            length = tensor.nbytes
            meta = onnx.TensorProto(name=value.name, data_type=tensor.dtype.value, dims=tensor.shape.numpy())
            head = meta.SerializeToString() + _RAW_DATA_TAG + varint(length)
            initializer = _INITIALIZER_TAG + varint(len(head) + length) + head
            sink.write(_GRAPH_TAG + varint(len(initializer) + length) + initializer)
            offset = sink.tell()
            if isinstance(tensor, ComputedTensor):
                sink.write(scratch.holding(tensor.compute()))
            elif hasattr(tensor, "tofile"):  # onnx_ir's tensors stream; another TensorProtocol may only have bytes
                tensor.tofile(sink)
            else:
                sink.write(tensor.tobytes())
            if sink.tell() != offset + length:
                raise ExportError(f"writing initializer {value.name!r}: {sink.tell() - offset} bytes written, its "
                                  f"type and shape make {length}; please report this")
            value.const_value = ir.ExternalTensor(data.name, offset, length, tensor.dtype, shape=tensor.shape,
                                                  name=value.name, base_dir=data.parent)


def _append_graph(graph: onnx.ModelProto, data: Path) -> None:
    """Append ``graph``, less the stubs of the initializers already in the framed ``data`` file, to that file: the
    file is then the one-file model."""
    inline = [init for init in graph.graph.initializer if init.data_location != onnx.TensorProto.EXTERNAL]
    del graph.graph.initializer[:]
    graph.graph.initializer.extend(inline)
    with data.open("ab") as sink:
        sink.write(graph.SerializeToString())


_GRAPH_TAG = length_delimited_tag(onnx.ModelProto.GRAPH_FIELD_NUMBER)
_INITIALIZER_TAG = length_delimited_tag(onnx.GraphProto.INITIALIZER_FIELD_NUMBER)
_RAW_DATA_TAG = length_delimited_tag(onnx.TensorProto.RAW_DATA_FIELD_NUMBER)
