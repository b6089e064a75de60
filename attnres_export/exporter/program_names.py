"""Names a torch.export program gives its inputs, outputs and dynamic dims, for its ONNX export and for
``attnres inspect``.

torch.onnx names a program's outputs after the FX nodes that compute them (``linear_12``) and its dynamic dims after
torch's shape symbols (``s23``), names that change with any edit of the model. The program's signature says more:
the structure of what the module returns (``{"logits": ...}``, a tuple) and, per input, which axes are dynamic. The
export names each output from that structure (``logits``; ``output`` for a lone tensor, ``output_0``... for a
tuple) and each dim after the first input axis it sizes: ``batch`` (axis 0), ``seq`` (axis 1), else
``INPUT_dimAXIS``. A ``torch.export.Dim``'s own name does not survive in the program (torch 2.13 keys its range
constraints by its symbols), so it cannot be used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import onnx_ir as ir
import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import OutputKind, TensorArgument

AXIS_NAMES = {0: "batch", 1: "seq"}


def output_names(program: torch.export.ExportedProgram) -> list[str]:
    """One name per tensor the program returns, from where it sits in the returned structure."""
    spec = program.call_spec.out_spec
    if spec is None:
        return []
    paths, _ = pytree.tree_flatten_with_path(pytree.tree_unflatten(list(range(spec.num_leaves)), spec))
    user = [s for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    if len(user) != len(paths):
        return []
    return [_path_name(path) for (path, _), s in zip(paths, user, strict=True) if isinstance(s.arg, TensorArgument)]


def _path_name(path: tuple) -> str:
    """``("logits",)`` -> ``logits``, ``(1, 0)`` -> ``output_1.0``, ``()`` -> ``output``."""
    parts = [str(key.key) if isinstance(key, pytree.MappingKey) else str(key.idx)
             if isinstance(key, pytree.SequenceKey) else key.name for key in path]
    if not parts:
        return "output"
    return f"output_{'.'.join(parts)}" if isinstance(path[0], pytree.SequenceKey) else ".".join(parts)


def user_inputs(program: torch.export.ExportedProgram) -> list[tuple[str, torch.Tensor]]:
    """The program's user inputs that are tensors, by name, with their example (fake) tensor."""
    wanted = set(program.graph_signature.user_inputs)
    return [(node.name, node.meta["val"]) for node in program.graph.nodes
            if node.op == "placeholder" and node.name in wanted and isinstance(node.meta.get("val"), torch.Tensor)]


def dim_names(program: torch.export.ExportedProgram) -> dict[str, str]:
    """torch's symbol of each dynamic dim (``s72``) -> the name the export gives it (``batch``)."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for input_name, tensor in user_inputs(program):
        for axis, size in enumerate(tensor.shape):
            symbol = _symbol(size)
            if symbol is None or symbol in names:
                continue
            name = AXIS_NAMES.get(axis, f"{input_name}_dim{axis}")
            if name in taken:
                name = f"{input_name}_dim{axis}"
            names[symbol] = name
            taken.add(name)
    return names


def _symbol(size: int | torch.SymInt) -> str | None:
    expr = size.node.expr if isinstance(size, torch.SymInt) else None
    return str(expr) if expr is not None and expr.is_Symbol else None


def spelled(size: int | torch.SymInt, names: dict[str, str]) -> str:
    """A dim of the program as its export spells it: a number, a name, or an expression of names."""
    return rename_expression(str(size.node.expr) if isinstance(size, torch.SymInt) else str(size), names)


def rename_expression(text: str, names: dict[str, str]) -> str:
    """``s70 + 1`` -> ``seq + 1``: every symbol in ``text`` replaced by its name."""
    if not names:
        return text
    pattern = re.compile(r"(?<!\w)(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")(?!\w)")
    return pattern.sub(lambda match: names[match.group(1)], text)


def name_from_signature(model: ir.Model, program: torch.export.ExportedProgram) -> None:
    """Rename the outputs and dynamic dims of ``model``, the ONNX export of ``program``, from its signature."""
    values = [*model.graph.inputs, *model.graph.initializers.values(),
              *(v for node in ir.traversal.RecursiveGraphIterator(model.graph) for v in node.outputs)]
    names = output_names(program)
    if len(names) == len(model.graph.outputs):
        taken = {v.name for v in values if v not in model.graph.outputs}
        for value, name in zip(model.graph.outputs, names, strict=True):
            if value in model.graph.inputs or value.name in model.graph.initializers:
                continue  # an input returned as it came keeps its own name
            unique, n = name, 0
            while unique in taken:
                n += 1
                unique = f"{name}_{n}"
            value.name = unique
            taken.add(unique)
    dims = dim_names(program)
    for value in values:
        if value.shape is not None and any(isinstance(d, ir.SymbolicDim) and d.value for d in value.shape):
            value.shape = ir.Shape([rename_expression(d.value, dims) if isinstance(d, ir.SymbolicDim) and d.value
                                    else d for d in value.shape])


@dataclass
class ProgramSummary:
    """What ``attnres inspect`` shows of a .pt2 program, named as its export names them."""

    inputs: list[tuple[str, str, list[str]]]
    outputs: list[tuple[str, str, list[str]]]
    dims: list[tuple[str, int, int | None]]
    """Each dynamic dim: its name and range (None: no upper bound)."""
    parameters: int
    nodes: int
    softmaxes: int
    """Candidate fusion sites: every depth aggregation and attention layer holds one."""


def summarize_program(program: torch.export.ExportedProgram) -> ProgramSummary:
    """The program as its export will read: names from its signature, so ``attnres inspect`` and the ONNX agree."""
    names = dim_names(program)
    outputs = user_outputs(program)
    labels = output_names(program) or [f"output_{i}" for i in range(len(outputs))]
    calls = [node for node in program.graph.nodes if node.op == "call_function"]
    return ProgramSummary(
        inputs=[(name, _dtype(t), [spelled(d, names) for d in t.shape]) for name, t in user_inputs(program)],
        outputs=[(name, _dtype(t), [spelled(d, names) for d in t.shape])
                 for name, t in zip(labels, outputs, strict=True)],
        dims=[(names.get(str(symbol), str(symbol)), int(r.lower), int(r.upper) if r.upper.is_Integer else None)
              for symbol, r in program.range_constraints.items()],
        parameters=sum(program.state_dict[name].numel() for name in program.graph_signature.parameters),
        nodes=len(calls),
        softmaxes=sum("softmax" in str(node.target) for node in calls),
    )


def user_outputs(program: torch.export.ExportedProgram) -> list[torch.Tensor]:
    """The example (fake) tensors the program returns, in order (buffer mutations and non-tensors left out)."""
    returned = next(iter(program.graph.find_nodes(op="output"))).args[0]
    return [node.meta["val"] for spec, node in zip(program.graph_signature.output_specs, returned, strict=True)
            if spec.kind == OutputKind.USER_OUTPUT and isinstance(spec.arg, TensorArgument)]


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")
