"""Tracing each kind of piece of an export plan once (docs/exporter-notes.md#assembled-export).

The first piece of every kind is traced with its weights as graph inputs (empty stand-ins of their shape and type:
no weight passes through the trace), all kinds in one ``torch.onnx.export`` call so that torch.onnx's fixed cost
(building its op registry, setting up the tracer) is paid once. Each kind gets its own symbolic dims, so no piece's
graph reads another's input shapes; the traced graph is then cut into one graph per kind, and the trace's symbol
names are mapped back to the plan's dim names (``batch``, ``seq``, ``past``, ``total``). The combined trace holds no
weight, so it can come from the trace cache instead (``exporter/trace_cache.py``): torch.onnx is imported only to
trace.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx_ir as ir
import sympy
import torch
from torch import nn

from attnres_export.dims import DimRange
from attnres_export.dtypes import torch_dtype
from attnres_export.errors import AttnresError, ExportError
from attnres_export.exporter.trace_cache import Uncacheable, entry_path, read_trace, trace_key, write_trace
from attnres_export.graphs.schemas import register_schemas
from attnres_export.models.base import PlanPiece, PlanValue

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class TracedKind:
    """One kind's graph, cut out of the combined trace."""

    kind: str
    inputs: list[ir.Value]
    """The piece's inputs, in signature order."""
    weights: list[tuple[str, ir.Value]]
    """(name in the piece's module, graph input) per weight."""
    outputs: list[ir.Value]
    nodes: list[ir.Node]
    """Every node the outputs depend on, in graph order."""
    shapes: dict[ir.Value, ir.Shape | None]
    """Each value's shape with the plan's dim names."""
    dim_names: dict[str, str]
    """Trace symbol -> plan dim name (for the values inside subgraphs, renamed when a copy is made)."""


def piece_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The weights of a piece: its parameters and buffers, by name in the module."""
    return [*module.named_parameters(), *module.named_buffers()]


class _Representatives(nn.Module):
    """Calls the first piece of each kind on its own inputs, with its weights given as inputs too. The pieces'
    modules are held in a plain tuple, not registered, so the trace captures none of their tensors."""

    def __init__(self, pieces: list[PlanPiece]) -> None:
        super().__init__()
        self.pieces = tuple(pieces)
        self.weight_names = tuple([name for name, _ in piece_tensors(p.module)] for p in pieces)

    def forward(self, inputs: list[list[torch.Tensor]], weights: list[list[torch.Tensor]]) -> tuple[torch.Tensor, ...]:
        outputs: list[torch.Tensor] = []
        for piece, names, args, tensors in zip(self.pieces, self.weight_names, inputs, weights, strict=True):
            out = torch.func.functional_call(piece.module, dict(zip(names, tensors, strict=True)), tuple(args))
            outputs.extend(out if isinstance(out, tuple) else (out,))
        return tuple(outputs)


def trace_kinds(pieces: list[PlanPiece], ranges: dict[str, DimRange], sizes: dict[str, int], dtype: str,
                opset: int, cache: Path | None = None, status: Callable[[str], None] = lambda _: None
                ) -> tuple[dict[str, TracedKind], ir.Model]:
    """Trace the first piece of each kind at the trace ``sizes`` of the dims, dynamic over their ``ranges``; returns
    each kind's graph and the combined trace they were cut from. With a ``cache`` folder the combined trace is read
    from it when this code traced these pieces before, and stored there after a trace (``exporter/trace_cache.py``).
    """
    register_schemas()
    first = first_of_each_kind(pieces)
    key, why = None, None
    if cache is not None:
        try:
            key = cache_key(first, ranges, sizes, dtype, opset)
        except Uncacheable as exc:
            why = str(exc)
    model = None if key is None else read_trace(cache, key)
    if model is not None:
        status(f"traced pieces: from cache {entry_path(cache, key)}")
    else:
        start = time.perf_counter()
        model = _trace(first, ranges, sizes, dtype, opset)
        seconds = time.perf_counter() - start
        if cache is not None and key is not None:
            try:
                write_trace(cache, key, model)
            except (OSError, ValueError, AttnresError) as exc:
                why = f"cannot write {entry_path(cache, key)}: {exc}"
        status(f"traced {len(first)} kinds in {seconds:.1f} s" + (f" (not cached: {why})" if why else ""))
    return _cut(first, model), model


def first_of_each_kind(pieces: list[PlanPiece]) -> list[PlanPiece]:
    """The pieces traced: the first of each kind, each checked to read as many values as its signature lists."""
    firsts: dict[str, PlanPiece] = {}
    for piece in pieces:
        firsts.setdefault(piece.kind, piece)
    for piece in firsts.values():
        if len(piece.signature) != len(piece.inputs):
            raise ExportError(f"the {piece.kind} piece reads {len(piece.inputs)} values but its signature lists "
                              f"{len(piece.signature)}; the model's export plan is wrong (please report this)")
    return list(firsts.values())


def cache_key(first: list[PlanPiece], ranges: dict[str, DimRange], sizes: dict[str, int], dtype: str,
              opset: int) -> str:
    """The trace cache's key of the trace of ``first``: everything ``_trace`` reads (each piece's kind, signature,
    output count, weights as ``piece_tensors`` lists them, module) and the dims, dtype and opset; raises
    Uncacheable."""
    pieces = [[p.kind, p.signature, len(p.outputs), [(name, str(t.dtype), tuple(t.shape))
                                                    for name, t in piece_tensors(p.module)], p.module]
              for p in first]
    return trace_key([pieces, ranges, sizes, dtype, opset])


def _trace(first: list[PlanPiece], ranges: dict[str, DimRange], sizes: dict[str, int], dtype: str,
           opset: int) -> ir.Model:
    """The combined trace of the ``first`` piece of each kind, by ``torch.onnx.export``."""
    from attnres_export.exporter.to_onnx import quiet_torch_onnx_export, translation_table

    inputs, weights, dynamic, input_names, output_names = [], [], [], [], []
    for index, piece in enumerate(first):
        dims = {name: torch.export.Dim(f"{name}_{index}", min=rng.min, max=rng.max)
                for name, rng in ranges.items() if rng.min < rng.max}
        inputs.append([_example(value, sizes, dtype) for value in piece.signature])
        dynamic.append([{axis: dims[label] for axis, label in enumerate(value.axes) if label in dims}
                        for value in piece.signature])
        tensors = piece_tensors(piece.module)
        weights.append([torch.empty(t.shape, dtype=t.dtype) for _, t in tensors])
        input_names.extend(f"{piece.kind}/{value.name}" for value in piece.signature)
        output_names.extend(f"{piece.kind}/out{i}" for i in range(len(piece.outputs)))
    weight_names = [f"{piece.kind}/{name}" for piece in first for name, _ in piece_tensors(piece.module)]
    representatives = _Representatives(first)
    program = quiet_torch_onnx_export(
        representatives, (inputs, weights), custom_translation_table=translation_table(),
        dynamic_shapes=(dynamic, [[None] * len(w) for w in weights]), input_names=input_names + weight_names,
        output_names=output_names, opset_version=opset)
    # after a trace with a torch.cond (an MoE), torch.export's module-stack tracer outlives the export and holds the
    # module it traced to the end of attnres-export: without its pieces it holds none of the model's weights
    representatives.pieces = ()
    _drop_debug_metadata(program.model)
    return program.model


def _cut(first: list[PlanPiece], model: ir.Model) -> dict[str, TracedKind]:
    """Each kind's graph, cut out of the combined trace ``model``."""
    graph = model.graph
    by_name = {value.name: value for value in graph.inputs}
    produced = iter(graph.outputs)
    traced = {}
    for piece in first:
        piece_inputs = [by_name[f"{piece.kind}/{value.name}"] for value in piece.signature]
        piece_weights = [(name, by_name[f"{piece.kind}/{name}"]) for name, _ in piece_tensors(piece.module)]
        outputs = [next(produced) for _ in piece.outputs]
        nodes = _nodes_reaching(graph, outputs, {*piece_inputs, *(v for _, v in piece_weights)}, piece.kind)
        names = _dim_names(piece.signature, piece_inputs)
        values = [*piece_inputs, *(v for _, v in piece_weights), *(o for n in nodes for o in n.outputs)]
        traced[piece.kind] = TracedKind(piece.kind, piece_inputs, piece_weights, outputs, nodes,
                                        {v: renamed(v.shape, names) for v in values}, names)
    return traced


def _drop_debug_metadata(model: ir.Model) -> None:
    """Drop torch.onnx's debug metadata of every node (``pkg.torch.onnx.stack_trace`` and friends): the copies in
    the main graph never carried it, but the subgraphs of a ``torch.cond`` (an MoE) kept it, and it names the source
    files by absolute path and the FX modules by a per-process counter (``<eval_with_key>.11``), so an export
    depended on where attnres is installed and on how many models the process had traced before."""
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        node.metadata_props.clear()


def _example(value: PlanValue, sizes: dict[str, int], dtype: str) -> torch.Tensor:
    shape = [sizes[a] if isinstance(a, str) else a for a in value.axes]
    held = torch_dtype(dtype) if value.dtype == "model" else getattr(torch, value.dtype)
    return torch.zeros(shape, dtype=held)


def _nodes_reaching(graph: ir.Graph, outputs: list[ir.Value], own: set[ir.Value], kind: str) -> list[ir.Node]:
    """The nodes ``outputs`` depend on, in graph order; a graph input other than the piece's own is refused."""
    inputs = set(graph.inputs)
    needed: set[ir.Node] = set()
    pending = list(outputs)
    while pending:
        value = pending.pop()
        if value in inputs and value not in own:
            raise ExportError(f"the traced {kind} piece reads {value.name}, another piece's input; please report "
                              "this (export with --trace-whole meanwhile)")
        node = value.producer()
        if node is None or node in needed:
            continue
        needed.add(node)
        pending.extend(v for v in node.inputs if v is not None)
        pending.extend(outer_reads(node))
    return [node for node in graph if node in needed]


def subgraphs(node: ir.Node) -> list[ir.Graph]:
    """The subgraphs of ``node``'s attributes (an ``If``'s branches, a ``Loop``'s or ``Scan``'s body)."""
    graphs: list[ir.Graph] = []
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            graphs.append(attr.as_graph())
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs.extend(attr.as_graphs())
    return graphs


def outer_reads(node: ir.Node) -> list[ir.Value]:
    """The values of the enclosing graph that ``node``'s subgraphs read: ONNX lets a subgraph read any value in
    scope by name, so these are inputs of the node too (torch.onnx's ``If`` of a ``torch.cond`` and ``Loop`` of a
    ``torch.while_loop`` read the weights and activations this way)."""
    reads: dict[ir.Value, None] = {}

    def walk(graph: ir.Graph, outer: set[ir.Value]) -> None:
        defined = outer | set(graph.inputs) | set(graph.initializers.values())
        for inner in graph:
            reads.update((v, None) for v in inner.inputs if v is not None and v not in defined)
            for sub in subgraphs(inner):
                walk(sub, defined)
            defined.update(inner.outputs)

    for sub in subgraphs(node):
        walk(sub, set())
    return list(reads)


def _dim_names(signature: tuple[PlanValue, ...], values: list[ir.Value]) -> dict[str, str]:
    """Trace symbol -> plan dim name, read off the piece's inputs."""
    names = {}
    for spec, value in zip(signature, values, strict=True):
        if value.shape is None:
            continue
        for label, dim in zip(spec.axes, value.shape, strict=True):
            if isinstance(label, str) and isinstance(dim, ir.SymbolicDim) and dim.value is not None \
                    and _IDENTIFIER.fullmatch(dim.value):
                names[dim.value] = label
    return names


def renamed(shape: ir.Shape | None, names: dict[str, str]) -> ir.Shape | None:
    """``shape`` with the trace's symbols replaced by the plan's dim names (``names``)."""
    if shape is None:
        return None
    return ir.Shape([_renamed_dim(d, names) for d in shape])


def _renamed_dim(dim: int | ir.SymbolicDim, names: dict[str, str]) -> int | str | None:
    if isinstance(dim, int) or dim.value is None:
        return dim if isinstance(dim, int) else None
    if dim.value in names:
        return names[dim.value]
    symbols = {token: sympy.Symbol(token) for token in _IDENTIFIER.findall(dim.value) if token in names}
    expr = sympy.sympify(dim.value, locals=symbols)
    return str(expr.subs({symbol: sympy.Symbol(names[token]) for token, symbol in symbols.items()}))
