"""Reading attributes of, and building, ONNX nodes: the little the op descriptors need from onnx."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx
from onnx import TensorProto
from onnx import helper as oh

Fresh = Callable[[str], str]
"""Returns a value name, built from a hint, that collides with nothing in the graph."""


def attribute(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """The value of attribute ``name`` of ``node`` (``default`` when absent)."""
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


class NodeBuilder:
    """Appends nodes named ``<prefix>/<hint>_<n>`` whose outputs get fresh names: the body of a decomposition."""

    def __init__(self, prefix: str, fresh: Fresh) -> None:
        self.prefix = prefix
        self.fresh = fresh
        self.nodes: list[onnx.NodeProto] = []

    def add(self, op: str, inputs: list[str], hint: str, n_outputs: int = 1, **attrs) -> list[str]:
        outputs = [self.fresh(hint) for _ in range(n_outputs)]
        self.nodes.append(oh.make_node(op, inputs, outputs, name=f"{self.prefix}/{hint}_{len(self.nodes)}", **attrs))
        return outputs

    def one(self, op: str, inputs: list[str], hint: str, **attrs) -> str:
        return self.add(op, inputs, hint, **attrs)[0]

    def constant(self, hint: str, tensor: onnx.TensorProto) -> str:
        return self.one("Constant", [], hint, value=tensor)

    def scalar(self, hint: str, value: float) -> str:
        return self.constant(hint, oh.make_tensor(hint, TensorProto.FLOAT, [], [value]))

    def as_float(self, name: str, storage_type: int, hint: str) -> str:
        """``name`` itself when float32, else a Cast of it to float32."""
        return name if storage_type == TensorProto.FLOAT else self.one("Cast", [name], hint, to=TensorProto.FLOAT)

    def finish(self, value: str, output: str, storage_type: int) -> None:
        """Write float32 ``value`` to the node's ``output`` in the storage type (Identity or Cast)."""
        if storage_type == TensorProto.FLOAT:
            self.nodes.append(oh.make_node("Identity", [value], [output], name=f"{self.prefix}/out"))
        else:
            self.nodes.append(oh.make_node("Cast", [value], [output], name=f"{self.prefix}/out", to=storage_type))
