"""Routed experts with integer-quantized weights as ONNX Runtime's ``QMoE``
(docs/onnxruntime-target.md#quantized-experts-qmoe): the part of the experts rewrite (experts.py) that reads the
quantized stacks and writes them in ``QMoE``'s layout.

A quantized export's gather branch reads each expert stack as ``Gather`` of its INT8 values, of its float32 scales
``[E, N, ceil(K / block)]`` and, when asymmetric, of its INT8 zero points, then a blocked ``DequantizeLinear`` along
``K`` (exporter/quantized_graph.py). ``QMoE`` (``quant_type="int"``, ``weights_prepacked=0``) takes the same
blocks as unsigned bytes: values ``u = v + 2^(bits-1)`` ``[E, N, K * bits / 8]`` (4-bit: two to a byte, the lower
column in the low nibble), the same scales, and zero points ``z + 2^(bits-1)`` packed the same way along the blocks
(absent: ``2^(bits-1)``, a symmetric stack). Its CPU kernel (1.32) computes them in float32 for 4-bit blocks and
for one scale per row (no ``block_size``, scales ``[E, N]``, zero points packed along ``N``), 4 or 8 bits; it runs
block-wise 8-bit experts on int8 activations, so those stay in standard ops. Its schema asks for a block that
divides both ``K`` (hidden and intermediate sizes); the CPU kernel computes others exactly through a dequantize +
SGEMM fallback but warns at every session, so those stay too. The export writes 4-bit values as INT8 (ONNX's
``Gather`` takes no INT4): a stack is 4-bit here when every value and zero point is in -8..7, which makes the 4-bit
form exact whatever the checkpoint said.

Each stack is rewritten where it is (``store``): same name, new type and shape, its bytes in the staging data file
at their offset (the packed 4-bit values take half of the INT8 values' bytes), so the export's file grows by
nothing and holds no unused initializer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from attnres_export.graphs.onnxruntime_ops.nodes import Nodes, attr
from attnres_export.graphs.protobuf_wire import length_delimited_tag, varint

MIN_BLOCK = 16
"""``QMoE``'s smallest block (a power of two)."""


@dataclass(frozen=True)
class Stack:
    """One expert stack's initializers as its ``DequantizeLinear`` reads them, and the block it declares."""

    values: str
    scales: str
    zero_points: str | None
    block_size: int


@dataclass(frozen=True)
class Quantized:
    """What ``QMoE`` is told of the two stacks: their bits and common block (None: one scale per row)."""

    gate_up: Stack
    down: Stack
    bits: int
    block_size: int | None


def dequantized_gather(sub: onnx.GraphProto, nodes: Nodes, gather: onnx.NodeProto) -> tuple[str, Stack] | None:
    """``(the dequantized weight's value, its stack)`` when ``gather`` (of a values stack) feeds a blocked
    ``DequantizeLinear`` along the last axis whose scales and zero points are gathered from the enclosing graph
    with the same indices, and a Cast; None for any other reader."""
    readers = nodes.consumers.get(gather.output[0], [])
    if len(readers) != 1 or readers[0].op_type != "DequantizeLinear" or readers[0].input[0] != gather.output[0]:
        return None
    dequantize = readers[0]
    block = attr(dequantize, "block_size", 0)
    if attr(dequantize, "axis", 1) not in (-1, 2) or block < 1:
        return None
    parts = []
    for name in list(dequantize.input[1:3]) + [""] * (3 - len(dequantize.input)):
        source = nodes.producer(name) if name else None
        if name and (source is None or source.op_type != "Gather" or attr(source, "axis", 0) != 0
                     or source.input[1] != gather.input[1] or nodes.producer(source.input[0]) is not None):
            return None
        parts.append(source.input[0] if source is not None else None)
    weight = dequantize.output[0]
    cast = nodes.only_consumer(weight, "Cast")
    return (cast.output[0] if cast is not None else weight), Stack(gather.input[0], parts[0], parts[1], block)


def plan(graph: onnx.GraphProto, nodes: Nodes, gate_up: Stack, down: Stack, data_dir: Path | None) -> Quantized | str:
    """What ``QMoE`` computes of these stacks exactly, or the reason (without the layer) it cannot."""
    tensors = {i.name: i for i in graph.initializer}
    names = [n for stack in (gate_up, down) for n in (stack.values, stack.scales, stack.zero_points) if n]
    if any(n not in tensors for n in names):
        return "read quantized stacks that are not initializers"
    values = [tensors[s.values] for s in (gate_up, down)]
    if any(v.data_type != onnx.TensorProto.INT8 for v in values):
        kind = onnx.TensorProto.DataType.Name(values[0].data_type)
        return f"have {kind} values; QMoE is written for integer (INT8/INT4) experts only"
    if any([r.op_type for r in nodes.consumers.get(n, [])] != ["If"] for n in names):
        return "share their quantized stacks with other nodes, so they cannot be rewritten for QMoE in place"
    if data_dir is None and any(uses_external_data(tensors[n]) for n in names):
        return "keep their weights in external data (load the model with its data to rewrite them)"
    blocks = []
    for stack, stacked in zip((gate_up, down), values, strict=True):
        e, n, k = stacked.dims
        count = -(-k // stack.block_size)
        scales = tensors[stack.scales]
        if scales.data_type != onnx.TensorProto.FLOAT:
            return ("have float16 or bfloat16 scales (a half-precision model): QMoE is written for float32 models, "
                    "whose float32 activations the parity check holds it to")
        points = tensors[stack.zero_points] if stack.zero_points else None
        if list(scales.dims) != [e, n, count] or (points is not None and (
                list(points.dims) != [e, n, count] or points.data_type != onnx.TensorProto.INT8)):
            return "have scales or zero points of another shape than one per block of each row"
        blocks.append(count)
    hidden, inner = values[0].dims[2], values[1].dims[2]
    block = None if blocks == [1, 1] else gate_up.block_size
    if block is not None and (down.block_size != block or block < MIN_BLOCK or block & (block - 1)
                              or hidden % block or inner % block):
        return (f"have blocks of {gate_up.block_size} (gate/up) and {down.block_size} (down) columns for hidden "
                f"size {hidden} and intermediate size {inner}: QMoE's schema takes one block size, a power of "
                f"two of at least {MIN_BLOCK} dividing both (ONNX Runtime 1.32 falls back to a warned-about slow path "
                "for a partial block)")
    bits = 4 if all(_in_4_bits(tensors[n], data_dir) for s in (gate_up, down)
                    for n in (s.values, s.zero_points) if n) else 8
    if bits == 8 and block is not None:
        return (f"have 8-bit values in blocks of {block}: ONNX Runtime's CPU QMoE computes block-wise 8-bit experts "
                "on int8 activations, not the float32 ones the parity check holds it to")
    if bits == 4 and (hidden % 2 or inner % 2):
        return "have an odd hidden or intermediate size, which QMoE cannot pack two 4-bit values to a byte"
    return Quantized(gate_up, down, bits, block)


def write(graph: onnx.GraphProto, quantized: Quantized, gate_first: bool, data_dir: Path | None) -> list[str]:
    """Rewrite the stacks in ``QMoE``'s layout, each where it is (the gate/up stack's rows interleaved gate, up);
    returns ``QMoE``'s inputs after ``router_probs``."""
    tensors = {i.name: i for i in graph.initializer}
    bits, per_row = quantized.bits, quantized.block_size is None
    offset = 1 << (bits - 1)
    named = []
    for stack in (quantized.gate_up, quantized.down):
        interleave = gate_first if stack is quantized.gate_up else None
        values = _rows(tensors[stack.values], interleave, data_dir).astype(np.int16) + offset
        store(tensors[stack.values], _packed(values, bits), data_dir)
        scales = _rows(tensors[stack.scales], interleave, data_dir)
        store(tensors[stack.scales], scales[..., 0] if per_row else scales, data_dir)
        if stack.zero_points:
            points = _rows(tensors[stack.zero_points], interleave, data_dir).astype(np.int16) + offset
            store(tensors[stack.zero_points], _packed(points[..., 0] if per_row else points, bits), data_dir)
        named.append((stack.values, stack.scales, stack.zero_points or ""))
    rewritten = {name for names in named for name in names}
    kept = [info for info in graph.value_info if info.name not in rewritten]  # their old type and shape
    del graph.value_info[:]
    graph.value_info.extend(kept)
    (fc1, fc1_scales, fc1_points), (fc2, fc2_scales, fc2_points) = named
    inputs = [fc1, fc1_scales, "", fc2, fc2_scales, "", "", "", "", fc1_points, fc2_points]
    while not inputs[-1]:
        inputs.pop()
    return inputs


def _rows(tensor: onnx.TensorProto, gate_first: bool | None, data_dir: Path | None) -> np.ndarray:
    """A stack's value, its rows interleaved gate, up for ``swiglu_fusion=1`` unless ``gate_first`` is None (the
    down stack)."""
    array = read(tensor, data_dir)
    return array if gate_first is None else _interleave(array, gate_first)


def attributes(quantized: Quantized) -> dict:
    """``QMoE``'s quantization attributes: integer blocks in the raw layout, float32 activations."""
    found = {"expert_weight_bits": quantized.bits, "quant_type": "int", "weights_prepacked": 0, "accuracy_level": 0}
    if quantized.block_size is not None:
        found["block_size"] = quantized.block_size
    return found


def _in_4_bits(tensor: onnx.TensorProto, data_dir: Path | None) -> bool:
    array = read(tensor, data_dir)
    return bool(array.size == 0 or (array.min() >= -8 and array.max() <= 7))


def _interleave(stack: np.ndarray, gate_first: bool) -> np.ndarray:
    """Rows ``[g0, u0, g1, u1, ...]`` of a gate/up stack ``[E, 2I, ...]`` (``swiglu_fusion=1``)."""
    half = stack.shape[1] // 2
    gate, up = (stack[:, :half], stack[:, half:]) if gate_first else (stack[:, half:], stack[:, :half])
    return np.ascontiguousarray(np.stack([gate, up], axis=2).reshape(stack.shape))


def _packed(unsigned: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned values as bytes along the last axis: 8-bit as they are, 4-bit two to a byte, low nibble first (an
    odd row padded with 0)."""
    unsigned = unsigned.astype(np.uint8)
    if bits == 8:
        return unsigned
    if unsigned.shape[-1] % 2:
        unsigned = np.concatenate([unsigned, np.zeros((*unsigned.shape[:-1], 1), np.uint8)], axis=-1)
    return np.ascontiguousarray(unsigned[..., 0::2] | (unsigned[..., 1::2] << 4))


def read(tensor: onnx.TensorProto, data_dir: Path | None) -> np.ndarray:
    """``tensor``'s value, from its external data file under ``data_dir`` when stored there."""
    if not uses_external_data(tensor):
        return numpy_helper.to_array(tensor)
    info = ExternalDataInfo(tensor)
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    count = int(np.prod(tensor.dims))
    with open(Path(data_dir) / info.location, "rb") as file:
        file.seek(info.offset or 0)
        return np.frombuffer(file.read(count * dtype.itemsize), dtype).reshape(tuple(tensor.dims))


def store(tensor: onnx.TensorProto, array: np.ndarray, data_dir: Path | None) -> None:
    """Make ``tensor`` (keeping its name) hold ``array``, which is at most as many bytes: inline, or written over
    its bytes in the external data file. In a staging file laid out as the start of a one-file model
    (exporter/staging.py), those bytes are framed as a ``graph.initializer`` field holding the tensor's name, type
    and shape: the frame is rewritten for the new type and shape within the same bytes (the tensor's
    ``doc_string``, given twice and empty the second time, takes up the bytes left), so the one-file model reads the
    new tensor and nothing else there."""
    if not uses_external_data(tensor):
        tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
        return
    info = ExternalDataInfo(tensor)
    data = np.ascontiguousarray(array).tobytes()
    offset, length = info.offset or 0, info.length or len(read(tensor, data_dir).tobytes())
    frame = _frame(tensor.name, tensor.data_type, list(tensor.dims), length)
    dtype = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    with open(Path(data_dir) / info.location, "r+b") as file:
        start = offset - len(frame)
        file.seek(max(start, 0))
        if start >= 0 and file.read(len(frame)) == frame:
            region = _reframed(tensor.name, dtype, list(array.shape), data, len(frame) + length)
            file.seek(start)
            file.write(region)
            offset = start + len(region) - len(data)
        else:
            file.seek(offset)
            file.write(data)
    del tensor.dims[:]
    tensor.dims.extend(array.shape)
    tensor.data_type = dtype
    entries = {"offset": str(offset), "length": str(len(data))}
    for entry in tensor.external_data:
        entry.value = entries.pop(entry.key, entry.value)
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)


_GRAPH = length_delimited_tag(onnx.ModelProto.GRAPH_FIELD_NUMBER)
_INITIALIZER = length_delimited_tag(onnx.GraphProto.INITIALIZER_FIELD_NUMBER)
_RAW_DATA = length_delimited_tag(onnx.TensorProto.RAW_DATA_FIELD_NUMBER)
_DOC = length_delimited_tag(onnx.TensorProto.DOC_STRING_FIELD_NUMBER)


def _head(name: str, data_type: int, dims: list[int], fill: bytes, length: int) -> bytes:
    """``graph { initializer { name, data_type, dims, fill, raw_data } }`` up to the raw bytes (``length`` of
    them)."""
    tensor = onnx.TensorProto(name=name, data_type=data_type, dims=dims).SerializeToString() + fill
    tensor += _RAW_DATA + varint(length)
    initializer = _INITIALIZER + varint(len(tensor) + length) + tensor
    return _GRAPH + varint(len(initializer) + length) + initializer


def _frame(name: str, data_type: int, dims: list[int], length: int) -> bytes:
    """The frame exporter/staging.py writes before a tensor's bytes in a one-file layout."""
    return _head(name, data_type, dims, b"", length)


def _reframed(name: str, data_type: int, dims: list[int], data: bytes, size: int) -> bytes:
    """``size`` bytes framing ``data`` as the tensor ``name``: the frame, ``doc_string`` fields filling the bytes
    ``data`` does not, and ``data`` last."""
    least = len(_head(name, data_type, dims, b"", len(data))) + len(data)
    for fill_size in range(max(size - least - 12, 0), size - least + 1):
        fill = _fill(fill_size)
        if fill is not None and len(_head(name, data_type, dims, fill, len(data))) + len(data) == size:
            return _head(name, data_type, dims, fill, len(data)) + data
    raise ValueError(f"{name}: {len(data)} bytes cannot be framed in {size} (please report this)")


def _fill(size: int) -> bytes | None:
    """``size`` bytes of ``doc_string`` fields, the last one empty when there is room (a parser keeps the last, so
    the zeros before it are dropped); None when no such fields make ``size``."""
    empty = _DOC + varint(0)
    for empties in (1, 2, 0):
        rest = size - len(empty) * empties
        if rest == 0:
            return empty * empties
        for count in range(max(rest - 12, 0), rest):
            if len(_DOC) + len(varint(count)) + count == rest:
                return _DOC + varint(count) + bytes(count) + empty * empties
    return None
