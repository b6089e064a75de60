"""RMS norms that add no eps: what torch.onnx.export's default optimizer leaves of ``x / sqrt(mean(x^2) + eps)``
when eps is 1e-8 or less (onnxscript's ``Add(x, 0)`` rule takes any ``|c| <= 1e-8`` for 0). Such a graph is not the
PyTorch model: slightly off wherever ``mean(x^2)`` is small, and NaN wherever a row is all zeros (0 / 0: a block that
starts from ``torch.zeros_like``). The user is told in one line with the fix; when the reference run meets an
all-zero row in one of them, the eps is put back into all of them (``DROPPED_EPS``) before fusing, since no fused or
unfused graph could match the model otherwise (docs/fusion.md#an-eps-the-exporter-dropped).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper as oh
from onnx import numpy_helper

from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.graphs.fusion.handwritten import through_casts
from attnres_export.graphs.onnx_utils import copy_model, replace_nodes, unique_namer

DROPPED_EPS = 1e-8
"""The largest eps the optimizer drops: what is put back where a row of zeros met a norm without one (any eps > 0
gives that row what the model gives it; below ``mean(x^2)`` of 1e-4 the exact value shows)."""
FIX = ("re-export with torch.onnx.export(..., optimize=False), or give attnres-export the .pt2 program, which keeps "
       "the eps")
NO_EPS = ("RMS norm without eps (x / sqrt(mean(x^2)), nothing added): torch.onnx.export's default optimizer drops an "
          "eps of 1e-8 or less, so this graph and the model fused from it (aggregations over such a norm take eps 0) "
          f"may differ from the PyTorch model; {FIX}")
RESTORED = ("RMS norm without eps (x / sqrt(mean(x^2)), nothing added), which divides an all-zero row by 0 (NaN): "
            "torch.onnx.export's default optimizer drops an eps of 1e-8 or less; eps "
            f"{DROPPED_EPS:g} was put back into every such norm before fusing and checking; for the model's own eps, "
            f"{FIX}")
ROOTS = ("Sqrt", "Pow")
SQUARE_SUMS = ("ReduceSum", "ReduceSumSquare")


@dataclass(frozen=True)
class EpsFreeNorm:
    root: onnx.NodeProto
    """The ``Sqrt`` (or ``Pow`` by +-0.5) of the mean of squares."""

    @property
    def mean(self) -> str:
        """The mean of squares: where the eps would have been added."""
        return self.root.input[0]


def eps_free_norms(index: GraphIndex) -> list[EpsFreeNorm]:
    """Every square root of a mean of squares (``ReduceMean`` of ``x^2``, or a sum of squares scaled by a constant)
    that nothing is added to."""
    return [EpsFreeNorm(node) for node in index.nodes
            if _is_root(index, node) and _mean_of_squares(index, node.input[0])]


def meet_zero_rows(norms: list[EpsFreeNorm], values: dict[str, np.ndarray]) -> bool:
    """Did one of ``norms`` meet an all-zero row in the reference run (its result there is 0 / 0)?"""
    return any(n.mean in values and not np.all(np.asarray(values[n.mean]) != 0) for n in norms)


def restore_eps(model: onnx.ModelProto, norms: list[EpsFreeNorm], types: dict[str, int]) -> onnx.ModelProto:
    """A copy of ``model`` whose ``norms`` add ``DROPPED_EPS`` to their mean of squares (``types``: declared element
    types)."""
    out = copy_model(model)
    graph = out.graph
    fresh = unique_namer(graph, "attnres_fusion")
    roots = {n.root.output[0] for n in norms}
    nodes = []
    for node in graph.node:
        if node.op_type in ROOTS and node.output[0] in roots:
            eps, padded = fresh("dropped_eps"), fresh("mean_with_eps")
            dtype = oh.tensor_dtype_to_np_dtype(types.get(node.input[0], onnx.TensorProto.FLOAT))
            graph.initializer.append(numpy_helper.from_array(np.array(DROPPED_EPS, dtype=dtype), eps))
            nodes.append(oh.make_node("Add", [node.input[0], eps], [padded], name=padded))
            node.input[0] = padded
        nodes.append(node)
    replace_nodes(graph, nodes)
    return out


def eps_warning(norms: list[EpsFreeNorm], restored: bool) -> dict[str, list[str]]:
    """The one warning about ``norms`` (given their eps back or not), naming their means; none without norms."""
    return {RESTORED if restored else NO_EPS: [n.mean for n in norms]} if norms else {}


def _is_root(index: GraphIndex, node: onnx.NodeProto) -> bool:
    if node.op_type == "Sqrt":
        return True
    exponent = index.constant(node.input[1]) if node.op_type == "Pow" and len(node.input) > 1 else None
    return exponent is not None and exponent.size == 1 and abs(float(exponent.ravel()[0])) == 0.5


def _mean_of_squares(index: GraphIndex, name: str) -> bool:
    node = through_casts(index, name)
    if node is not None and node.op_type in ("Mul", "Div"):
        scaled = [i for i in node.input if index.constant(i) is None]
        if len(scaled) != 1 or node.input[0] != scaled[0]:
            return False
        node = through_casts(index, scaled[0])
        if node is None or node.op_type not in SQUARE_SUMS:
            return False
    elif node is None or node.op_type != "ReduceMean":
        return False
    return node.op_type == "ReduceSumSquare" or _is_square(index, node.input[0])


def _is_square(index: GraphIndex, name: str) -> bool:
    node = through_casts(index, name)
    if node is None:
        return False
    if node.op_type == "Mul":
        return node.input[0] == node.input[1]
    exponent = index.constant(node.input[1]) if node.op_type == "Pow" else None
    return exponent is not None and exponent.size == 1 and float(exponent.ravel()[0]) == 2.0
