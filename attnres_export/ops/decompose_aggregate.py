"""AttnResAggregate written in standard ONNX ops (the ``portable`` target, SPEC 4).

Per source: ``ReduceSumSquare`` and ``MatMul(v, sw)``; then the reciprocal RMS, ``Softmax`` over the source
axis and the weighted sum, all in float32 with a Cast back. Normalized sources are never materialized.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.graphs.onnx_utils import attribute

MIN_OPSET = 17


def decompose_aggregate(
    node: onnx.NodeProto, storage_type: int, opset: int, fresh
) -> list[onnx.NodeProto]:
    """Nodes computing ``node``'s output from its inputs; every new node is named ``<node.name>/...``."""
    if opset < MIN_OPSET:
        raise ValueError(f"the portable decomposition needs default opset >= {MIN_OPSET}, the model has {opset}")
    prefix = node.name
    eps = float(attribute(node, "eps"))
    sw, sources = node.input[0], list(node.input[1:])
    n = len(sources)
    out: list[onnx.NodeProto] = []

    def add(op: str, inputs: list[str], hint: str, n_outputs: int = 1, **attrs) -> list[str]:
        outputs = [fresh(hint) for _ in range(n_outputs)]
        out.append(oh.make_node(op, inputs, outputs, name=f"{prefix}/{hint}_{len(out)}", **attrs))
        return outputs

    def const(hint: str, tensor: onnx.TensorProto) -> str:
        return add("Constant", [], hint, value=tensor)[0]

    axes_last = const("axes_last", oh.make_tensor("axes", TensorProto.INT64, [1], [-1]))
    sw_col = add("Unsqueeze", [sw, axes_last], "sw_col")[0]
    d_float = add("Cast", [add("Shape", [sw], "d")[0]], "d_float", to=TensorProto.FLOAT)[0]
    eps_c = const("eps", oh.make_tensor("eps", TensorProto.FLOAT, [], [eps]))

    floats, squares, dots = [], [], []
    for i, src in enumerate(sources):
        vf = src if storage_type == TensorProto.FLOAT else add("Cast", [src], f"src{i}_f32", to=TensorProto.FLOAT)[0]
        floats.append(vf)
        if opset >= 18:
            squares.append(add("ReduceSumSquare", [vf, axes_last], f"sumsq{i}", keepdims=1)[0])
        else:
            squares.append(add("ReduceSumSquare", [vf], f"sumsq{i}", axes=[-1], keepdims=1)[0])
        dots.append(add("MatMul", [vf, sw_col], f"dot{i}")[0])

    sumsq = add("Concat", squares, "sumsq", axis=-1)[0] if n > 1 else squares[0]
    dot = add("Concat", dots, "dot", axis=-1)[0] if n > 1 else dots[0]
    mean_sq = add("Div", [sumsq, d_float], "mean_sq")[0]
    inv_rms = add("Reciprocal", [add("Sqrt", [add("Add", [mean_sq, eps_c], "ms_eps")[0]], "rms")[0]], "inv_rms")[0]
    logits = add("Mul", [inv_rms, dot], "logits")[0]
    weights = add("Softmax", [logits], "weights", axis=-1)[0]

    if n == 1:
        mixed = add("Mul", [floats[0], weights], "mixed")[0]
    else:
        ones = const("split_sizes", oh.make_tensor("split", TensorProto.INT64, [n], [1] * n))
        parts = add("Split", [weights, ones], "weight", n_outputs=n, axis=-1)
        terms = [add("Mul", [vf, w], f"term{i}")[0] for i, (vf, w) in enumerate(zip(floats, parts, strict=True))]
        mixed = add("Sum", terms, "mixed")[0]
    result = node.output[0]
    if storage_type == TensorProto.FLOAT:
        out.append(oh.make_node("Identity", [mixed], [result], name=f"{prefix}/out"))
    else:
        out.append(oh.make_node("Cast", [mixed], [result], name=f"{prefix}/out", to=storage_type))
    return out
