"""The model graph from an export plan and its traced kinds (docs/exporter-notes.md#assembled-export).

Each piece becomes an inlined copy of its kind's traced graph, bound to the piece's own weights (initializers that
wrap the model's tensors: written to the staged data file as ``torch.onnx`` writes a traced model's, never copied
here); the aggregations and adds between pieces are written as nodes. Nodes of a piece that only rearrange its
weights (the transpose of an ``nn.Linear`` weight, a cast of a norm weight to float32) are not copied: their result is
an initializer computed from that copy's weight when the data file is written, as the whole-model trace's constant
folding would have stored it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir
import torch
from onnx_ir._cloner import Cloner
from onnx_ir.tensor_adapters import TorchTensor, from_torch_dtype, to_torch_dtype
from torch import nn

from attnres_export.dims import DimRange
from attnres_export.dtypes import torch_dtype
from attnres_export.errors import ExportError
from attnres_export.exporter.graph_proto import COPY_OF
from attnres_export.exporter.piece_trace import TracedKind, outer_reads, piece_tensors, renamed, subgraphs, trace_kinds
from attnres_export.exporter.staging import ComputedTensor
from attnres_export.models.base import ExportPlan, PlanAdd, PlanAggregate, PlannedModel, PlanPiece, PlanValue
from attnres_export.ops.descriptors import OPS, PLUGIN_ATTRIBUTES
from attnres_export.ops.opset import AGGREGATE, AGGREGATE_NORM, DOMAIN, OPSET_VERSION


def plan_of(model: nn.Module, with_past: bool, fuse_norm: bool) -> ExportPlan | None:
    """The model's export plan, or None for a family that has none (it is traced whole)."""
    if not isinstance(model, PlannedModel):
        return None
    return model.export_plan(with_past=with_past, fuse_norm=fuse_norm)


def export_planned(model: nn.Module, plan: ExportPlan, ranges: dict[str, DimRange], sizes: dict[str, int],
                   dtype: str, opset: int, status: Callable[[str], None],
                   read: Callable[[torch.Tensor], torch.Tensor] | None = None,
                   stored: Callable[[torch.Tensor], object | None] | None = None,
                   trace_cache: Path | None = None) -> ir.Model:
    """Trace each kind of piece of ``plan`` once (at the trace ``sizes``, dynamic over ``ranges``; or read the trace
    from the ``trace_cache`` folder, ``exporter/trace_cache.py``) and assemble the model graph; ``model`` is the
    model in the export dtype, whose tensors the plan's pieces hold. ``read`` gives the values of a tensor the model
    holds on the meta device (a streamed model, ``models.store``): such a tensor is read when the staging writer
    writes it, so the graph holds none of the model's large tensors. ``stored`` gives the stored tensor such a
    tensor reads: each initializer made from one carries it (``STORED``), so that ``exporter.quantized_graph`` can
    keep a quantized weight quantized."""
    kinds = list(dict.fromkeys(p.kind for p in plan.pieces()))
    status(f"tracing {len(kinds)} kinds of piece once ({', '.join(kinds)}; {dtype}, opset {opset})")
    traced, template = trace_kinds(plan.pieces(), ranges, sizes, dtype, opset, trace_cache, status)
    status(f"assembling {len(plan.pieces())} pieces and {len(plan.steps) - len(plan.pieces())} nodes between them")
    return assemble(plan, traced, model, dtype, template, read or _held, stored or _not_stored)


FOLDED = {
    "Transpose": lambda node, x: x.permute(*(node.attributes.get_ints("perm") or range(x.dim() - 1, -1, -1))),
    "Cast": lambda node, x: x.to(to_torch_dtype(ir.DataType(node.attributes.get_int("to")))),
    "Identity": lambda node, x: x,
    "Neg": lambda node, x: -x,
    "Exp": lambda node, x: torch.from_numpy(np.exp(x.detach().numpy())),
}
"""Weight-only ops whose results are written as initializers: one input each, a layout change, a cast, a negation,
which torch computes as ONNX defines it (a cast rounds to nearest even), or an ``Exp`` (KDA's ``-exp(A_log)``),
computed by NumPy as the whole-model trace's constant folding computes it (onnxscript folds with ONNX's NumPy
reference ops), so both exports hold the same bits; ONNX Runtime's own ``Exp`` differs from NumPy's in the last
float32 bit."""


@dataclass
class _Folding:
    """The nodes of a kind that only rearrange its weights, and their results that the copied nodes read."""

    nodes: set[ir.Node]
    read: list[ir.Value]


def _folding(kind: TracedKind) -> _Folding:
    weights = {value for _, value in kind.weights}
    done, nodes = set(weights), set()
    for node in kind.nodes:
        if (node.domain == "" and node.op_type in FOLDED and len(node.inputs) == 1 and node.inputs[0] in done
                and not set(node.outputs) & set(kind.outputs)
                and not (node.op_type == "Exp" and node.inputs[0].dtype == ir.DataType.BFLOAT16)):
            nodes.add(node)
            done.update(node.outputs)
    read = [v for node in kind.nodes if node not in nodes for v in [*node.inputs, *outer_reads(node)]
            if v is not None and v.producer() in nodes]
    return _Folding(nodes, list(dict.fromkeys(read)))


def _folded_value(value: ir.Value, weights: dict[ir.Value, torch.Tensor],
                  read: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``value`` computed from a copy's weights (read when on the meta device) by the folded nodes that produce
    it."""
    if value in weights:
        return read(weights[value])
    node = value.producer()
    return FOLDED[node.op_type](node, _folded_value(node.inputs[0], weights, read))


def _held(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _not_stored(tensor: torch.Tensor) -> None:
    return None


STORED = "attnres.stored"
"""``ir.Value.meta`` key of an initializer made from a tensor left in the checkpoint: ``(stored tensor, nodes)``,
the ``StoredTensor`` it reads and the folded nodes (``FOLDED``) that compute the initializer from it, first first."""


def _folded_nodes(value: ir.Value) -> tuple[ir.Value, list[ir.Node]]:
    """The weight a folded value comes from and the folded nodes on the way, first first."""
    nodes = []
    while value.producer() is not None:
        nodes.append(value.producer())
        value = value.producer().inputs[0]
    return value, nodes[::-1]


class _Assembly:
    """The graph being built: values by plan name, nodes, initializers."""

    def __init__(self, model: nn.Module, dtype: str, read: Callable[[torch.Tensor], torch.Tensor],
                 stored: Callable[[torch.Tensor], object | None]) -> None:
        self.dtype = dtype
        self.read_tensor = read
        self.stored = stored
        self.names: dict[int, str] = {}
        for name, tensor in [*model.named_parameters(remove_duplicate=False),
                             *model.named_buffers(remove_duplicate=False)]:
            self.names.setdefault(id(tensor), name)
        self.env: dict[str, ir.Value] = {}
        self.nodes: list[ir.Node] = []
        self.initializers: dict[str, ir.Value] = {}
        self.weights: dict[int, ir.Value] = {}
        self.constants: dict[ir.Value, ir.Value] = {}
        self.op_calls: dict[str, int] = {}

    def graph_input(self, spec: PlanValue) -> ir.Value:
        held = torch_dtype(self.dtype) if spec.dtype == "model" else getattr(torch, spec.dtype)
        value = ir.Value(name=spec.name, type=ir.TensorType(from_torch_dtype(held)), shape=ir.Shape(spec.axes))
        self.env[spec.name] = value
        return value

    def read(self, name: str, reader: str) -> ir.Value:
        if name not in self.env:
            raise ExportError(f"{reader} reads {name!r}, which no graph input or earlier step produces; the model's "
                              "export plan is wrong (please report this; --trace-whole exports it meanwhile)")
        return self.env[name]

    def publish(self, value: ir.Value, name: str, like: ir.Value) -> None:
        """Name the output ``value`` of a new node ``name`` in the plan, typed as ``like``."""
        if name in self.env:
            raise ExportError(f"the model's export plan produces {name!r} twice (please report this)")
        value.name, value.type = name, like.type
        value.shape = None if like.shape is None else ir.Shape(like.shape)
        self.env[name] = value

    def initializer(self, name: str, tensor: ir.TensorProtocol) -> ir.Value:
        while name in self.initializers or name in self.env:
            name += "_"
        value = ir.Value(name=name, type=ir.TensorType(tensor.dtype), shape=ir.Shape(tensor.shape), const_value=tensor)
        self.initializers[name] = value
        return value

    def weight(self, tensor: torch.Tensor, piece: PlanPiece) -> ir.Value:
        """The initializer of one of the model's tensors (one per tensor, however many pieces read it)."""
        key = id(tensor)
        if key not in self.weights:
            if key not in self.names:
                raise ExportError(f"piece {piece.name} has a weight that is not a tensor of the model; the model's "
                                  "export plan is wrong (please report this)")
            name = self.names[key]
            if tensor.is_meta:
                stored = ComputedTensor(lambda: self.read_tensor(tensor), from_torch_dtype(tensor.dtype),
                                        ir.Shape(tensor.shape), name)
                self.weights[key] = self.initializer(name, stored)
                self.weights[key].meta[STORED] = (self.stored(tensor), [])
            else:
                self.weights[key] = self.initializer(name, TorchTensor(tensor.detach(), name=name))
        return self.weights[key]

    def constant(self, value: ir.Value, piece: PlanPiece) -> ir.Value:
        """A constant of a traced kind, shared by every copy."""
        if value.const_value is None:
            raise ExportError(f"piece {piece.name} reads {value.name}, which is neither its input, its weight nor "
                              "a constant of its trace (please report this)")
        if value not in self.constants:
            self.constants[value] = self.initializer(f"const/{value.name}", value.const_value)
        return self.constants[value]

    def piece(self, piece: PlanPiece, kind: TracedKind, folding: _Folding) -> None:
        tensors = piece_tensors(piece.module)
        expected = [(name, tuple(value.shape), value.dtype) for name, value in kind.weights]
        found = [(name, tuple(t.shape), from_torch_dtype(t.dtype)) for name, t in tensors]
        if found != expected:
            raise ExportError(f"piece {piece.name} has weights {_few(found)} where the first {piece.kind} piece has "
                              f"{_few(expected)}; the model's export plan puts unlike pieces in one kind")
        mapped: dict[ir.Value, ir.Value] = {}
        for value, name in zip(kind.inputs, piece.inputs, strict=True):
            mapped[value] = self.read(name, f"piece {piece.name}")
        own = {value: tensor for (_, value), (_, tensor) in zip(kind.weights, tensors, strict=True)}
        for value in folding.read:
            mapped[value] = self._folded(value, own, piece)
        outputs = dict(zip(kind.outputs, piece.outputs, strict=True))
        for node in kind.nodes:
            if node in folding.nodes:
                continue
            inputs = [self._input(v, mapped, own, piece) for v in node.inputs]
            attributes = self._attributes(node, mapped, own, piece, kind)
            copy = ir.Node(node.domain, node.op_type, inputs, attributes=attributes, overload=node.overload,
                           num_outputs=len(node.outputs), version=node.version, name=self._node_name(node, piece))
            if not subgraphs(node):
                copy.meta[COPY_OF] = node
            for old, new in zip(node.outputs, copy.outputs, strict=True):
                new.name, new.type = outputs.get(old, f"{piece.name}/{old.name}"), old.type
                shape = kind.shapes.get(old)
                new.shape = None if shape is None else ir.Shape(shape)
                mapped[old] = new
            self.nodes.append(copy)
        for old, name in outputs.items():
            if name in self.env:
                raise ExportError(f"the model's export plan produces {name!r} twice (please report this)")
            self.env[name] = mapped[old]

    def _node_name(self, node: ir.Node, piece: PlanPiece) -> str:
        """An attnres node (a ``KimiDeltaAttention`` inside a piece) is named as torch.onnx names the n-th call of
        its op in the whole model (with the suffix the trace gave it: ``node_kimi_delta_attention_2__1``), so
        TensorRT's plugin layers read the same in both exports; any other node after its piece."""
        if node.domain == DOMAIN and node.op_type in OPS:
            base = OPS[node.op_type].torch_op.split("::")[1]
            traced = re.fullmatch(rf"node_{base}(?:_\d+)?(.*)", node.name or "")
            return self._traced_name(node.op_type) + (traced.group(1) if traced else "")
        return f"{piece.name}/{node.name}"

    def _attributes(self, node: ir.Node, mapped: dict[ir.Value, ir.Value], own: dict[ir.Value, torch.Tensor],
                    piece: PlanPiece, kind: TracedKind) -> list[ir.Attr]:
        """The node's attributes; a subgraph (an ``If`` branch, a ``Loop`` body) is cloned with the values it
        reads from the piece bound to this copy's, its own values named after the piece."""
        if not subgraphs(node):
            return list(node.attributes.values())
        bound = {value: self._input(value, mapped, own, piece) for value in outer_reads(node)}
        cloner = Cloner(attr_map={}, value_map=bound, metadata_props={})
        attributes = [cloner.clone_attr(key, attr) for key, attr in node.attributes.items()]
        _rename_scopes(attributes, f"{piece.name}/{node.name}", kind.dim_names)
        return attributes

    def _input(self, value: ir.Value | None, mapped: dict[ir.Value, ir.Value], own: dict[ir.Value, torch.Tensor],
               piece: PlanPiece) -> ir.Value | None:
        """What a copied node reads for the traced ``value``: a value of this copy, a weight (its initializer is
        made when a kept node reads it, so a weight only read through a folded node is not written), or a
        constant."""
        if value is None:
            return None
        if value in mapped:
            return mapped[value]
        if value in own:
            return self.weight(own[value], piece)
        return self.constant(value, piece)

    def _folded(self, value: ir.Value, own: dict[ir.Value, torch.Tensor], piece: PlanPiece) -> ir.Value:
        root, nodes = _folded_nodes(value)
        weight = own[root]
        name = f"{self.names[id(weight)]}.{'.'.join(node.op_type.lower() for node in nodes)}"
        tensor = ComputedTensor(lambda: _folded_value(value, own, self.read_tensor), value.dtype,
                                ir.Shape(value.shape), name)
        initializer = self.initializer(name, tensor)
        if weight.is_meta:
            initializer.meta[STORED] = (self.stored(weight), nodes)
        return initializer

    def aggregate(self, step: PlanAggregate) -> None:
        sources = [self.read(name, f"aggregation {step.name}") for name in step.sources]
        weights = [self.initializer(f"{step.name}.score_weight", _vector(step.score_weight, step.name))]
        attributes = [ir.AttrFloat32("eps", step.eps)]
        if step.norm_weight is not None:
            weights.append(self.initializer(f"{step.name}.norm_weight", _vector(step.norm_weight, step.name)))
            attributes.append(ir.AttrFloat32("norm_eps", step.norm_eps))
        attributes += [ir.AttrString(key, value) for key, value in PLUGIN_ATTRIBUTES.items()]
        op = AGGREGATE if step.norm_weight is None else AGGREGATE_NORM
        node = ir.Node(DOMAIN, op, [*weights, *sources], attributes=attributes, name=self._traced_name(op))
        self.publish(node.outputs[0], step.output, like=sources[0])
        self.nodes.append(node)

    def _traced_name(self, op: str) -> str:
        """The name torch.onnx gives the n-th call of the op's torch custom op (``node_aggregate``,
        ``node_aggregate_1``, ...): the plan lists aggregations in the order the forward calls them, so both exports
        name each attnres node, and so each TensorRT plugin layer, alike."""
        base = OPS[op].torch_op.split("::")[1]
        calls = self.op_calls.get(base, 0)
        self.op_calls[base] = calls + 1
        return f"node_{base}" + (f"_{calls}" if calls else "")

    def add(self, step: PlanAdd) -> None:
        a, b = (self.read(name, f"the add producing {step.output}") for name in (step.a, step.b))
        node = ir.Node("", "Add", [a, b], name=f"{step.output}/Add")
        self.publish(node.outputs[0], step.output, like=a)
        self.nodes.append(node)


def _rename_scopes(attributes: list[ir.Attr], prefix: str, dim_names: dict[str, str]) -> None:
    """Name the values and nodes of cloned subgraphs after their piece, node and attribute
    (``layers.1.mlp/node_cond/then_branch/view``): torch.onnx numbers a subgraph's names on their own, so they could
    repeat a name of the piece's graph, and ONNX wants each name defined once in scope; shapes in the plan's dim
    names."""
    for attr in attributes:
        graphs = [attr.as_graph()] if attr.type == ir.AttributeType.GRAPH else \
            attr.as_graphs() if attr.type == ir.AttributeType.GRAPHS else []
        for index, graph in enumerate(graphs):
            scope = f"{prefix}/{attr.name}" + (f"{index}" if attr.type == ir.AttributeType.GRAPHS else "")
            for value in [*graph.inputs, *graph.initializers.values(), *(v for n in graph for v in n.outputs)]:
                if value.name:
                    value.name = f"{scope}/{value.name}"
                value.shape = renamed(value.shape, dim_names)
            for inner in graph:
                inner_attributes = list(inner.attributes.values())
                _rename_scopes(inner_attributes, f"{scope}/{inner.name}", dim_names)
                inner.name = f"{scope}/{inner.name}"


def _vector(tensor: torch.Tensor, name: str) -> TorchTensor:
    if tensor.dtype != torch.float32 or tensor.dim() != 1:
        raise ExportError(f"aggregation {name}: its weights must be float32 [D] vectors, got {tensor.dtype} "
                          f"{list(tensor.shape)} (please report this)")
    return TorchTensor(tensor.detach().contiguous())


def _few(items: list) -> str:
    return ", ".join(str(i) for i in items[:3]) + (f" and {len(items) - 3} more" if len(items) > 3 else "")


def assemble(plan: ExportPlan, traced: dict[str, TracedKind], model: nn.Module, dtype: str,
             template: ir.Model, read: Callable[[torch.Tensor], torch.Tensor] = _held,
             stored: Callable[[torch.Tensor], object | None] = _not_stored) -> ir.Model:
    """The model graph of ``plan``: its inputs, every step in order, its outputs (``template``: the combined trace,
    for the opsets and producer fields)."""
    assembly = _Assembly(model, dtype, read, stored)
    inputs = [assembly.graph_input(spec) for spec in plan.inputs]
    foldings = {kind: _folding(traced_kind) for kind, traced_kind in traced.items()}
    for step in plan.steps:
        if isinstance(step, PlanPiece):
            assembly.piece(step, traced[step.kind], foldings[step.kind])
        elif isinstance(step, PlanAggregate):
            assembly.aggregate(step)
        else:
            assembly.add(step)
    outputs = [assembly.read(name, "the graph's outputs") for name in plan.outputs]
    opsets = dict(template.graph.opset_imports)
    if any(isinstance(step, PlanAggregate) for step in plan.steps):
        opsets[DOMAIN] = OPSET_VERSION
    graph = ir.Graph(inputs, outputs, nodes=assembly.nodes, initializers=list(assembly.initializers.values()),
                     opset_imports=opsets, name=template.graph.name)
    return ir.Model(graph, ir_version=template.ir_version, producer_name=template.producer_name,
                    producer_version=template.producer_version)
