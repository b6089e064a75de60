"""Quantized weights kept quantized in the exported graph (docs/quantization.md#in-the-graph).

The assembly marks each initializer made from a weight left in the checkpoint with the stored tensor it reads and
the folded nodes (transposes) between them (``assemble.STORED``). Here each such initializer of a quantized weight
is replaced by a standard blocked ``DequantizeLinear`` (opset 21) of its blocks, permuted as the folded nodes permute
the weight: the integer (or FP8) values, one scale per block of input columns, and zero points when the format has
them. ONNX Runtime's graph optimizer turns a ``DequantizeLinear`` on axis 0 feeding a ``MatMul`` into
``MatMulNBits`` (4 and 8 bits, docs/onnx-runtime-notes.md#dequantizelinear-and-matmulnbits). A ``Gather`` of a
dequantized weight (the chosen experts of a stacked expert tensor, the rows of an embedding) is moved before the
``DequantizeLinear``: only the gathered blocks are dequantized at run time.

Each weight's blocks are read when the staging writer writes its values, once for its values, scales and zero
points, which are written one after the other (``_LastBlocks``)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import onnx_ir as ir
import torch
from onnx_ir.tensor_adapters import from_torch_dtype

from attnres_export.backends.onnxruntime.runner import FLOAT_ACTIVATIONS
from attnres_export.dtypes import torch_dtype
from attnres_export.errors import ExportError
from attnres_export.exporter.assemble import STORED
from attnres_export.exporter.sibling_matmul_nbits import pack_siblings
from attnres_export.exporter.staging import ComputedTensor
from attnres_export.graphs.tensorrt_quantization import dequantize_problem
from attnres_export.models.store.quantized import Blocked, QuantizedTensor
from attnres_export.models.store.quantized.base import Layout

MIN_OPSET = 21
"""Blocked ``DequantizeLinear`` and the INT4 type are ONNX opset 21."""


@dataclass
class QuantizedWeights:
    """What ``keep_quantized`` did: weights kept quantized by format, and their bytes in the graph."""

    formats: Counter
    stored_bytes: int
    parameters: int
    tensorrt_problems: Counter
    """With the ``tensorrt`` target: why TensorRT would not build some weights' DequantizeLinear, and how many."""
    matmul_nbits: list[tuple[QuantizedTensor, int, str]] = field(default_factory=list)
    """Each weight written as ``MatMulNBits``: its block size and the name of its packed initializer (``B``)."""


class _LastBlocks:
    """The blocks of the weight written last: its values, scales and zero points are written in a row."""

    def __init__(self) -> None:
        self.weight: QuantizedTensor | None = None
        self.blocks: Blocked | None = None

    def of(self, weight: QuantizedTensor) -> Blocked:
        if self.weight is not weight:
            self.weight, self.blocks = None, None
            blocks = weight.blocked()
            if blocks is None:
                raise ExportError(f"{weight.where}: its {weight.format} blocks could not be read (please report this)")
            self.weight, self.blocks = weight, blocks
        return self.blocks


def keep_quantized(model: ir.Model, dtype: str, target: str, matmul_nbits: bool = False,
                   accuracy_level: int = FLOAT_ACTIVATIONS) -> QuantizedWeights:
    """Replace, in place, every initializer of ``model`` made from a quantized weight by a ``DequantizeLinear`` of
    its blocks, cast to the export ``dtype`` where the scales are of another type. For the ``tensorrt`` target a
    matrix with one scale per row (and no zero points) is written per channel (a 1-D scale), the form TensorRT
    takes for INT8 and FP8. With ``matmul_nbits``, an integer matrix that only ``MatMul``s read as their weight is
    written as ``com.microsoft.MatMulNBits`` with this ``accuracy_level`` (``FLOAT_ACTIVATIONS`` or
    ``INT8_ACTIVATIONS``); those of one input are then one node (``sibling_matmul_nbits``)."""
    cache = _LastBlocks()
    export_type = from_torch_dtype(torch_dtype(dtype))
    done = QuantizedWeights(Counter(), 0, 0, Counter())
    for value in list(model.graph.initializers.values()):
        stored = value.meta.get(STORED)
        if stored is None or not isinstance(stored[0], QuantizedTensor):
            continue
        weight, nodes = stored
        layout = weight.layout()
        if layout is None:
            raise ExportError(f"{weight.where}: {weight.format} weights whose groups are not consecutive column "
                              "blocks (GPTQ act-order, desc_act) cannot be kept quantized in ONNX; use a checkpoint "
                              "quantized without act-order")
        perm = _permutation(nodes, len(weight.shape), value.name)
        if layout.bits == 4 and _gathered(value):
            layout = replace(layout, bits=8)
        if matmul_nbits and (packed := _as_matmul_nbits(model.graph, value, weight, layout, perm, cache, export_type,
                                                        accuracy_level)):
            done.matmul_nbits.append((weight, layout.block_size, packed))
            done.formats[weight.format] += 1
            done.stored_bytes += weight.stored_nbytes
            done.parameters += math.prod(weight.shape)
            continue
        per_channel = (target == "tensorrt" and len(weight.shape) == 2 and layout.block_size >= weight.shape[-1]
                       and not layout.zero_points and layout.bits == 8)
        parts = _initializers(model.graph, weight, layout, perm, cache, export_type, value.name, per_channel)
        axis = perm.index(len(weight.shape) - 2 if per_channel else len(weight.shape) - 1)
        out = _dequantize(parts, axis, None if per_channel else layout.block_size, export_type, value.name,
                          model.graph, before=None)
        if target == "tensorrt":
            problem = dequantize_problem(_values_type(layout).name.lower(), len(weight.shape),
                                         1 if per_channel else len(weight.shape), layout.zero_points)
            if problem is not None:
                done.tensorrt_problems[problem] += 1
        ir.convenience.replace_all_uses_with(value, out)
        model.graph.initializers.pop(value.name)
        if not per_channel:
            _gather_before_dequantize(out, parts, axis, layout, export_type)
        done.formats[weight.format] += 1
        done.stored_bytes += sum(p.const_value.nbytes for p in parts if p is not None)
        done.parameters += math.prod(weight.shape)
    if done.matmul_nbits:
        stacked = pack_siblings(model.graph)
        done.matmul_nbits = [(weight, block, stacked.get(b, b)) for weight, block, b in done.matmul_nbits]
    if done.formats:
        for opset in ("", "ai.onnx"):
            if model.graph.opset_imports.get(opset, MIN_OPSET) < MIN_OPSET:
                raise ExportError(f"quantized weights need opset {MIN_OPSET} or higher, the export has "
                                  f"{model.graph.opset_imports[opset]} (please report this)")
    return done




def _as_matmul_nbits(graph: ir.Graph, value: ir.Value, weight: QuantizedTensor, layout: Layout, perm: list[int],
                     cache: _LastBlocks, export_type: ir.DataType, accuracy_level: int) -> str | None:
    """Replace each ``MatMul(x, value)`` by ``MatMulNBits(x, B, scales[, zero_points])`` when ``value`` is the
    transposed ``[in, out]`` form of a 2-D integer ``weight`` read by nothing else, and the scales are exact in the
    activations' type (float32, or float16 with float16 scales), and return ``B``'s name; None (nothing done)
    otherwise. ``B`` holds the
    values offset to unsigned (``q + 2**(bits-1)``, MatMulNBits' default zero point) ``[out, blocks, block*bits/8]``,
    the first of two 4-bit values in the low nibble; the zero points likewise, packed per row."""
    uses = list(value.uses())
    if (len(weight.shape) != 2 or perm != [1, 0] or layout.values != torch.int8 or not uses
            or any(node.op_type != "MatMul" or node.domain != "" or index != 1 for node, index in uses)
            or export_type not in (ir.DataType.FLOAT, ir.DataType.FLOAT16)
            or (export_type == ir.DataType.FLOAT16 and not layout.float16_scales)):
        return None
    rows, columns = weight.shape
    bits, block = layout.bits, layout.block_size
    if block < 16 or block & (block - 1):
        return None
    blocks = -(-columns // block)
    base = value.name or "quantized"
    scale_dtype = torch.float16 if export_type == ir.DataType.FLOAT16 else torch.float32

    def packed_values() -> torch.Tensor:
        values = cache.of(weight).values.to(torch.int16) + (1 << (bits - 1))
        values = torch.nn.functional.pad(values, (0, blocks * block - columns), value=1 << (bits - 1))
        return _packed_unsigned(values.reshape(rows, blocks, block), bits)

    def scales() -> torch.Tensor:
        return cache.of(weight).scales.reshape(-1).to(scale_dtype)

    def zero_points() -> torch.Tensor:
        offset = cache.of(weight).zero_points.to(torch.int16) + (1 << (bits - 1))
        return _packed_unsigned(offset, bits)

    inputs = [_initializer(graph, f"{base}.B", packed_values, ir.DataType.UINT8, [rows, blocks, block * bits // 8]),
              _initializer(graph, f"{base}.scales", scales, from_torch_dtype(scale_dtype), [rows * blocks])]
    if layout.zero_points:
        inputs.append(_initializer(graph, f"{base}.zero_points", zero_points, ir.DataType.UINT8,
                                   [rows, -(-blocks * bits // 8)]))
    attributes = [ir.AttrInt64("K", columns), ir.AttrInt64("N", rows), ir.AttrInt64("bits", bits),
                  ir.AttrInt64("block_size", block), ir.AttrInt64("accuracy_level", accuracy_level)]
    for node, _ in uses:
        fused = ir.Node("com.microsoft", "MatMulNBits", [node.inputs[0], *inputs], attributes=attributes,
                        name=f"{node.name}/MatMulNBits")
        fused.outputs[0].name, fused.outputs[0].type = node.outputs[0].name, node.outputs[0].type
        fused.outputs[0].shape = node.outputs[0].shape
        node.graph.insert_before(node, [fused])
        old = node.outputs[0]
        ir.convenience.replace_all_uses_with(old, fused.outputs[0], replace_graph_outputs=True)
        old.name = None
        node.graph.remove(node, safe=True)
    graph.initializers.pop(value.name)
    graph.opset_imports.setdefault("com.microsoft", 1)
    return inputs[0].name


def _packed_unsigned(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned ``values`` (last axis packed) as bytes: 8-bit as they are, 4-bit two to a byte, low nibble first."""
    values = values.to(torch.uint8)
    if bits == 8:
        return values.contiguous()
    if values.shape[-1] % 2:
        values = torch.nn.functional.pad(values, (0, 1))
    return (values[..., 0::2] | (values[..., 1::2] << 4)).contiguous()


def _gathered(value: ir.Value) -> bool:
    """Does a ``Gather`` read ``value``? ONNX's ``Gather`` takes no INT4 tensor, so gathered 4-bit values are
    written as INT8."""
    return any(node.op_type == "Gather" and index == 0 for node, index in value.uses())


def _permutation(nodes: list[ir.Node], rank: int, name: str | None) -> list[int]:
    """The permutation of the weight's axes the folded ``nodes`` compute (transposes only)."""
    perm = list(range(rank))
    for node in nodes:
        if node.op_type != "Transpose":
            raise ExportError(f"{name}: a quantized weight is read through a {node.op_type} before its matmul; only "
                              "transposes are kept quantized (please report this)")
        order = node.attributes.get_ints("perm") or list(range(rank - 1, -1, -1))
        perm = [perm[i] for i in order]
    return perm


def _values_type(layout: Layout) -> ir.DataType:
    if layout.values == torch.float8_e4m3fn:
        return ir.DataType.FLOAT8E4M3FN
    return ir.DataType.INT4 if layout.bits == 4 else ir.DataType.INT8


def _scale_type(layout: Layout, export_type: ir.DataType) -> ir.DataType:
    """The export type when the scales are exact in it and ONNX Runtime's CPU DequantizeLinear takes it (float32,
    float16); else float32, the result then cast to the export type."""
    if export_type == ir.DataType.FLOAT16 and layout.float16_scales:
        return ir.DataType.FLOAT16
    return ir.DataType.FLOAT


def _initializers(graph: ir.Graph, weight: QuantizedTensor, layout: Layout, perm: list[int], cache: _LastBlocks,
                  export_type: ir.DataType, name: str | None, per_channel: bool) -> list[ir.Value | None]:
    """The values, scales and zero points of ``weight`` as initializers permuted by ``perm`` (``per_channel``: the
    one scale of each row as a 1-D scale), written from its blocks when the staging writer writes them."""
    base = name or "quantized"
    shape = [weight.shape[i] for i in perm]
    blocks = [*weight.shape[:-1], -(-weight.shape[-1] // layout.block_size)]
    block_shape = [weight.shape[-2]] if per_channel else [blocks[i] for i in perm]
    values_type, scale_type = _values_type(layout), _scale_type(layout, export_type)
    where = weight.where

    def values() -> torch.Tensor:
        return _stored_values(cache.of(weight).values.permute(perm), values_type, where)

    def scales() -> torch.Tensor:
        scales = cache.of(weight).scales
        scales = scales.reshape(-1) if per_channel else scales.permute(perm)
        return scales.to(torch.float16 if scale_type == ir.DataType.FLOAT16 else torch.float32)

    def zero_points() -> torch.Tensor:
        return _stored_values(cache.of(weight).zero_points.permute(perm), values_type, where)

    made = [_initializer(graph, f"{base}.values", values, values_type, shape),
            _initializer(graph, f"{base}.scales", scales, scale_type, block_shape)]
    made.append(_initializer(graph, f"{base}.zero_points", zero_points, values_type, block_shape)
                if layout.zero_points else None)
    return made


def _initializer(graph: ir.Graph, name: str, compute: Callable[[], torch.Tensor], dtype: ir.DataType,
                 shape: list[int]) -> ir.Value:
    while name in graph.initializers:
        name += "_"
    tensor = ComputedTensor(compute, dtype, ir.Shape(shape), name)
    value = ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(shape), const_value=tensor)
    graph.register_initializer(value)
    return value


def _stored_values(values: torch.Tensor, dtype: ir.DataType, where: str) -> torch.Tensor:
    """``values`` as the bytes of ``dtype``: INT4 two to a byte, the first in the low nibble (ONNX's packing)."""
    if dtype != ir.DataType.INT4:
        return values.contiguous()
    flat = values.reshape(-1)
    if bool(((flat < -8) | (flat > 7)).any()):
        raise ExportError(f"{where}: a 4-bit value or zero point is outside -8..7 (please report this)")
    nibbles = (flat.to(torch.int16) & 0x0F).to(torch.uint8)
    if nibbles.numel() % 2:
        nibbles = torch.cat([nibbles, nibbles.new_zeros(1)])
    return nibbles[0::2] | (nibbles[1::2] << 4)


def _dequantize(parts: list[ir.Value | None], axis: int, block_size: int | None, export_type: ir.DataType,
                name: str | None, graph: ir.Graph, before: ir.Node | None) -> ir.Value:
    """``DequantizeLinear`` of ``parts`` (and a ``Cast`` to the export type when the scales are of another),
    inserted into ``graph`` before ``before`` (at its start when None); ``block_size`` None: per channel."""
    values, scales, zero_points = parts
    inputs = [values, scales] + ([zero_points] if zero_points is not None else [])
    attributes = [ir.AttrInt64("axis", axis)]
    if block_size is not None:
        attributes.append(ir.AttrInt64("block_size", block_size))
    dequantize = ir.Node("", "DequantizeLinear", inputs, attributes=attributes, name=f"{name}/DequantizeLinear")
    out = dequantize.outputs[0]
    out.name, out.type = f"{name}.dequantized", ir.TensorType(scales.dtype)
    out.shape = ir.Shape(values.shape) if values.shape is not None else None
    nodes = [dequantize]
    if scales.dtype != export_type:
        cast = ir.Node("", "Cast", [out], attributes=[ir.AttrInt64("to", export_type.value)], name=f"{name}/Cast")
        cast.outputs[0].name, cast.outputs[0].type = f"{name}.cast", ir.TensorType(export_type)
        cast.outputs[0].shape = out.shape
        nodes.append(cast)
        out = cast.outputs[0]
    if before is None:
        if len(graph):
            graph.insert_before(next(iter(graph)), nodes)
        else:
            graph.extend(nodes)
    else:
        graph.insert_before(before, nodes)
    return out


def _gather_before_dequantize(out: ir.Value, parts: list[ir.Value | None], axis: int, layout: Layout,
                              export_type: ir.DataType) -> None:
    """Each ``Gather`` of the dequantized weight along another axis than the blocks' gathers the blocks instead, and
    dequantizes only what it gathered; the whole weight's ``DequantizeLinear`` goes when nothing else reads it."""
    for node, index in list(out.uses()):
        if node.op_type != "Gather" or node.domain != "" or index != 0:
            continue
        rank = len(out.shape) if out.shape is not None else None
        gather_axis = node.attributes.get_int("axis", 0)
        indices = node.inputs[1]
        if rank is None or indices is None or indices.shape is None:
            continue
        gather_axis %= rank
        if gather_axis == axis:
            continue
        graph = node.graph
        gathered = []
        for part in parts:
            if part is None:
                gathered.append(None)
                continue
            copy = ir.Node("", "Gather", [part, indices], attributes=[ir.AttrInt64("axis", gather_axis)],
                           name=f"{node.name}/{part.name}")
            copy.outputs[0].name, copy.outputs[0].type = f"{node.outputs[0].name}/{part.name}", part.type
            graph.insert_before(node, [copy])
            gathered.append(copy.outputs[0])
        shifted = axis + len(indices.shape) - 1 if gather_axis < axis else axis
        result = _dequantize(gathered, shifted, layout.block_size, export_type, node.outputs[0].name, graph,
                             before=node)
        result.shape = node.outputs[0].shape
        ir.convenience.replace_all_uses_with(node.outputs[0], result)
        graph.remove(node, safe=True)
    _remove_if_unused(out)


def _remove_if_unused(out: ir.Value) -> None:
    while not out.uses() and not out.is_graph_output():
        node = out.producer()
        graph = node.graph
        source = node.inputs[0]
        graph.remove(node, safe=True)
        if source.producer() is None:
            return
        out = source
