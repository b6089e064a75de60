"""Refusing attnres nodes that break the op-set contract before anything (ONNX Runtime, TensorRT, a graph
transform) reads them: a malformed node gives one line naming the node and the problem, never a raw
IndexError or an abort inside ONNX Runtime."""

from __future__ import annotations

import onnx

from attnres_export.errors import OpSetError
from attnres_export.graphs.types import value_infos
from attnres_export.ops.descriptors import OPS, descriptor_of, is_attnres


def attnres_node_problems(model: onnx.ModelProto) -> list[str]:
    """One line per problem of every attnres node (structure first; shapes only when the structure is sound)."""
    problems = []
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
    infos = value_infos(model) if any(is_attnres(n) for n in model.graph.node) else {}
    for index, node in enumerate(model.graph.node):
        if is_attnres(node):
            op = descriptor_of(node)
            shapes = [infos[name].shape if name in infos else None for name in op.canonical_inputs(node)]
            problem = op.shape_problem(shapes)
            if problem:
                problems.append(f"node {node.name or f'#{index}'!r} ({node.op_type}): {problem}")
    return problems


def validate_attnres_nodes(model: onnx.ModelProto, source: str = "the model") -> None:
    """Raise OpSetError naming the first bad attnres node of ``model`` (and how many more there are)."""
    problems = attnres_node_problems(model)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise OpSetError(f"{source}: {problems[0]}{more}; re-export it, or see docs/op-set.md for the contract")
