"""Refusing attnres nodes that break the op-set contract before anything (ONNX Runtime, TensorRT, a graph
transform) reads them: a malformed node gives one line naming the node and the problem, never a raw
IndexError or an abort inside ONNX Runtime. A model-local function that would stand in for an attnres op is
refused the same way."""

from __future__ import annotations

import onnx

from attnres_export.errors import OpSetError
from attnres_export.ops.descriptors import OPS, descriptor_of, is_attnres
from attnres_export.ops.opset import DOMAIN


def attnres_node_problems(model: onnx.ModelProto) -> list[str]:
    """One line per problem of every attnres node (structure first; then the shapes the file states)."""
    problems = shadowing_functions(model)
    for index, node in enumerate(model.graph.node):
        if not is_attnres(node):
            continue
        label = f"node {node.name or f'#{index}'!r} ({node.op_type})"
        op = descriptor_of(node)
        if op is None:
            problems.append(f"{label}: the attnres op set has no op {node.op_type!r} (it has {', '.join(OPS)})")
            continue
        problems.extend(f"{label}: {p}" for p in op.node_problems(node))
    if problems:
        return problems
    shapes_known = declared_shapes(model)
    for index, node in enumerate(model.graph.node):
        if is_attnres(node):
            op = descriptor_of(node)
            shapes = [shapes_known.get(name) for name in op.canonical_inputs(node)]
            problem = op.shape_problem(shapes)
            if problem:
                problems.append(f"node {node.name or f'#{index}'!r} ({node.op_type}): {problem}")
    return problems


def shadowing_functions(model: onnx.ModelProto) -> list[str]:
    """Model-local functions that would stand in for an attnres op: any function of the ``attnres`` domain, and any
    named like an attnres op (onnx-tensorrt matches local functions by name alone, so TensorRT before 10.7 runs the
    function's body instead of the plugin; ONNX Runtime would run it instead of the op)."""
    return [f"model-local function {function.domain or '(default domain)'}::{function.name} defines "
            f"{'the attnres op ' + function.name if function.name in OPS else 'an op of the attnres domain'}, whose "
            "body would run instead of the attnres op or plugin; remove it from the model's functions"
            for function in model.functions if function.domain == DOMAIN or function.name in OPS]


def declared_shapes(model: onnx.ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Shapes the file states (initializers, graph inputs and outputs, value_info), without shape inference:
    validation must stay cheap on multi-GB models; an unstated shape is simply not checked here."""
    shapes: dict[str, tuple[int | None, ...]] = {}
    for value in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor.HasField("shape"):
            shapes[value.name] = tuple(d.dim_value or None for d in tensor.shape.dim)
    for init in model.graph.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


def validate_attnres_nodes(model: onnx.ModelProto, source: str = "the model") -> None:
    """Raise OpSetError naming the first bad attnres node of ``model`` (and how many more there are)."""
    problems = attnres_node_problems(model)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise OpSetError(f"{source}: {problems[0]}{more}; re-export it, or see docs/op-set.md for the contract")
