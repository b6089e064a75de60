"""AttnResAggregate written in standard ONNX ops: the ``portable`` target (docs/op-set.md#attnresaggregate).

Per source: ``ReduceSumSquare`` and ``MatMul(v, sw)``; then the reciprocal RMS, ``Softmax`` over the source
axis and the weighted sum, all in float32 with a Cast back. Normalized sources are never materialized.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.ops.onnx_nodes import Fresh, NodeBuilder, attribute


def decompose_aggregate(node: onnx.NodeProto, inputs: list[str], storage_type: int, opset: int,
                        fresh: Fresh) -> list[onnx.NodeProto]:
    """Nodes computing ``node``'s output from ``inputs`` (score weight, then sources), named ``<node.name>/...``."""
    b = NodeBuilder(node.name, fresh)
    eps = float(attribute(node, "eps"))
    sw, sources = inputs[0], inputs[1:]
    n = len(sources)

    axes_last = b.constant("axes_last", oh.make_tensor("axes", TensorProto.INT64, [1], [-1]))
    sw_col = b.one("Unsqueeze", [sw, axes_last], "sw_col")
    d_float = b.one("Cast", [b.one("Shape", [sw], "d")], "d_float", to=TensorProto.FLOAT)
    eps_c = b.scalar("eps", eps)

    floats, squares, dots = [], [], []
    for i, src in enumerate(sources):
        vf = b.as_float(src, storage_type, f"src{i}_f32")
        floats.append(vf)
        if opset >= 18:
            squares.append(b.one("ReduceSumSquare", [vf, axes_last], f"sumsq{i}", keepdims=1))
        else:
            squares.append(b.one("ReduceSumSquare", [vf], f"sumsq{i}", axes=[-1], keepdims=1))
        dots.append(b.one("MatMul", [vf, sw_col], f"dot{i}"))

    sumsq = b.one("Concat", squares, "sumsq", axis=-1) if n > 1 else squares[0]
    dot = b.one("Concat", dots, "dot", axis=-1) if n > 1 else dots[0]
    mean_sq = b.one("Div", [sumsq, d_float], "mean_sq")
    inv_rms = b.one("Reciprocal", [b.one("Sqrt", [b.one("Add", [mean_sq, eps_c], "ms_eps")], "rms")], "inv_rms")
    weights = b.one("Softmax", [b.one("Mul", [inv_rms, dot], "logits")], "weights", axis=-1)

    if n == 1:
        mixed = b.one("Mul", [floats[0], weights], "mixed")
    else:
        ones = b.constant("split_sizes", oh.make_tensor("split", TensorProto.INT64, [n], [1] * n))
        parts = b.add("Split", [weights, ones], "weight", n_outputs=n, axis=-1)
        terms = [b.one("Mul", [vf, w], f"term{i}") for i, (vf, w) in enumerate(zip(floats, parts, strict=True))]
        mixed = b.one("Sum", terms, "mixed")
    b.finish(mixed, node.output[0], storage_type)
    return b.nodes
