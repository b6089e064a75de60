"""Sibling ``MatMulNBits`` as one node (docs/quantization.md#one-matmulnbits-per-input).

A layer's query, key and value projections read one input. Written as one ``MatMulNBits`` each, every node pays
ONNX Runtime's per-node cost and, with int8 activations, quantizes that same input again; onnxruntime-genai's model
builder writes them as one node. Here ``MIN_MEMBERS`` or more ``MatMulNBits`` of one input with the same ``K``, bit
width, block size and accuracy level, whose weights are initializers read by nothing else, become one node over
their rows stacked (``B``, scales and zero points are all laid out row by row, so stacking rows is concatenation)
and a ``Split`` back to the original outputs, which keep their names. The ``onnxruntime`` target then feeds a
``GroupQueryAttention`` the stacked projection itself where the split only separated its query, key and value
(``graphs/onnxruntime_ops/packed_qkv.py``).

Each member's parts are computed when the staging writer writes the first stacked part, all of one member after
another (so ``quantized_graph._LastBlocks`` reads each weight's blocks once), and dropped after the last part.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import onnx_ir as ir
import torch

from attnres_export.exporter.staging import ComputedTensor

_ATTRIBUTES = ("K", "bits", "block_size", "accuracy_level")
MIN_MEMBERS = 3
"""A pair (a gated MLP's gate and up projections) is left as it is: its stack costs a ``Split`` for the one node it
saves, and measured within 2% (docs/quantization.md#one-matmulnbits-per-input)."""


def pack_siblings(graph: ir.Graph) -> dict[str, str]:
    """Stack, in place, the ``MatMulNBits`` of ``graph`` (not its subgraphs) that read one input with the same
    attributes, ``MIN_MEMBERS`` or more; returns each replaced ``B`` initializer's name -> the stacked one's."""
    groups: dict[tuple, list[ir.Node]] = defaultdict(list)
    for node in graph:
        if node.op_type == "MatMulNBits" and node.domain == "com.microsoft" and _packable(graph, node):
            groups[_signature(node)].append(node)
    renamed: dict[str, str] = {}
    for members in groups.values():
        if len(members) >= MIN_MEMBERS:
            names = [member.inputs[1].name for member in members]
            renamed.update(dict.fromkeys(names, _stack(graph, members)))
    return renamed


def _packable(graph: ir.Graph, node: ir.Node) -> bool:
    """Every weight input an initializer only this node reads, no ``g_idx`` or ``bias``, one output."""
    weights = node.inputs[1:]
    return (len(node.inputs) in (3, 4) and len(node.outputs) == 1
            and all(w is not None and w.name in graph.initializers and w.const_value is not None
                    and len(list(w.uses())) == 1 for w in weights))


def _signature(node: ir.Node) -> tuple:
    attributes = tuple(node.attributes.get_int(name, -1) for name in _ATTRIBUTES)
    weights = tuple((w.const_value.dtype, tuple(w.shape)[1:]) for w in node.inputs[1:])
    return (id(node.inputs[0]), attributes, weights)


def _stack(graph: ir.Graph, members: list[ir.Node]) -> str:
    """Replace ``members`` by one ``MatMulNBits`` over their stacked rows and a ``Split``; returns the new ``B``."""
    rows = [member.attributes.get_int("N") for member in members]
    parts = _StackedParts([[w.const_value for w in member.inputs[1:]] for member in members])
    first = members[0]
    stacked = []
    for index, part in enumerate(first.inputs[1:]):
        name = f"{part.name}.stacked"
        while name in graph.initializers:
            name += "_"
        shape = ir.Shape([sum(w.inputs[1 + index].shape[0] for w in members), *part.shape[1:]])
        value = ir.Value(name=name, type=ir.TensorType(part.const_value.dtype), shape=shape,
                         const_value=ComputedTensor(parts.getter(index), part.const_value.dtype, shape, name))
        graph.register_initializer(value)
        stacked.append(value)
    attributes = [ir.AttrInt64(name, first.attributes.get_int(name)) for name in _ATTRIBUTES]
    attributes.append(ir.AttrInt64("N", sum(rows)))
    matmul = ir.Node("com.microsoft", "MatMulNBits", [first.inputs[0], *stacked], attributes=attributes,
                     name=f"{first.name}/stacked")
    sizes_name = f"{stacked[0].name}.split"
    sizes = ir.Value(name=sizes_name, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([len(rows)]),
                     const_value=ir.tensor(rows, dtype=ir.DataType.INT64, name=sizes_name))
    graph.register_initializer(sizes)
    split = ir.Node("", "Split", [matmul.outputs[0], sizes], attributes=[ir.AttrInt64("axis", -1)],
                    num_outputs=len(members), name=f"{first.name}/split")
    matmul.outputs[0].name, matmul.outputs[0].type = f"{first.outputs[0].name}.stacked", first.outputs[0].type
    graph.insert_before(first, [matmul, split])
    for member, out in zip(members, split.outputs, strict=True):
        old = member.outputs[0]
        out.type, out.shape = old.type, old.shape
        ir.convenience.replace_all_uses_with(old, out, replace_graph_outputs=True)
        out.name, old.name = old.name, None
        weights = list(member.inputs[1:])
        graph.remove(member, safe=True)
        for weight in weights:
            graph.initializers.pop(weight.name)
    return stacked[0].name


class _StackedParts:
    """The stacked ``B``, scales and zero points of some ``MatMulNBits``, computed together on first use."""

    def __init__(self, members: list[list[ir.TensorProtocol]]) -> None:
        self.members = members
        self.parts: list[torch.Tensor] | None = None
        self.unread: set[int] = set()

    def getter(self, index: int) -> Callable[[], torch.Tensor]:
        return lambda: self.part(index)

    def part(self, index: int) -> torch.Tensor:
        if self.parts is None:
            computed = [[_as_torch(tensor) for tensor in member] for member in self.members]
            self.parts = [torch.cat([member[i] for member in computed]) for i in range(len(self.members[0]))]
            self.unread = set(range(len(self.parts)))
        part = self.parts[index]
        self.unread.discard(index)
        if not self.unread:
            self.parts = None
        return part


def _as_torch(tensor: ir.TensorProtocol) -> torch.Tensor:
    if isinstance(tensor, ComputedTensor):
        return tensor.compute()
    return torch.from_numpy(tensor.numpy().copy())
