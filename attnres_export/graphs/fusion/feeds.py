"""Random inputs for an ONNX graph made from its declared input shapes and types."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper as oh

from attnres_export.errors import GraphError

SYMBOLIC_SIZES = (2, 7, 3, 5)
"""Sizes given to symbolic dims, in order of first appearance (distinct, so axes are told apart by size)."""


def integer_high(model: onnx.ModelProto, name: str) -> int:
    """Upper bound (exclusive) for an integer input: the table size when it indexes a constant table, else 2."""
    tables = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name and node.input[0] in tables:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            return int(tables[node.input[0]].dims[axis])
    return 2


def input_shapes(model: onnx.ModelProto, overrides: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
    """Concrete shapes of the graph inputs; ``overrides`` wins, symbolic dims get ``SYMBOLIC_SIZES``."""
    overrides = overrides or {}
    symbols: dict[str, int] = {}
    initializers = {i.name for i in model.graph.initializer}
    shapes: dict[str, list[int]] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        if value.name in overrides:
            shapes[value.name] = list(overrides[value.name])
            continue
        dims = []
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(dim.dim_value)
            else:
                key = dim.dim_param or f"?{len(symbols)}"
                symbols.setdefault(key, SYMBOLIC_SIZES[len(symbols) % len(SYMBOLIC_SIZES)])
                dims.append(symbols[key])
        shapes[value.name] = dims
    unknown = set(overrides) - set(shapes)
    if unknown:
        raise GraphError(f"--example-shape names {sorted(unknown)}, the graph's inputs are {sorted(shapes)}")
    return shapes


def symbolic_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs with at least one symbolic (or unknown) dim: the ones random feeds had to size."""
    initializers = {i.name for i in model.graph.initializer}
    return [v.name for v in model.graph.input if v.name not in initializers
            and any(not d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)]


def random_feeds(
    model: onnx.ModelProto, seed: int = 0, overrides: dict[str, list[int]] | None = None, vocab: int | None = None
) -> dict[str, np.ndarray]:
    """One random array per graph input: normal floats, integers in ``[0, vocab or integer_high)``, booleans."""
    rng = np.random.default_rng(seed)
    elem_types = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    feeds: dict[str, np.ndarray] = {}
    for name, shape in input_shapes(model, overrides).items():
        dtype = oh.tensor_dtype_to_np_dtype(elem_types[name])
        if np.issubdtype(dtype, np.floating):
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[name] = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            feeds[name] = rng.integers(0, vocab or integer_high(model, name), shape).astype(dtype)
        else:
            raise GraphError(f"graph input {name!r} has type {dtype}; give the check inputs of a numeric type")
    return feeds
