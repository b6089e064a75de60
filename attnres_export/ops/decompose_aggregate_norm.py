"""AttnResAggregateNorm written in standard ONNX ops: the ``portable`` target (docs/op-set.md#attnresaggregatenorm).

The aggregation's own decomposition writes ``h`` in the storage type (the node's ``h`` output when it has one),
then the RMSNorm reads it back in float32, in the reference's order, and a Cast writes ``y``.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.ops.decompose_aggregate import decompose_aggregate
from attnres_export.ops.onnx_nodes import Fresh, NodeBuilder, attribute
from attnres_export.ops.opset import AGGREGATE


def decompose_aggregate_norm(node: onnx.NodeProto, inputs: list[str], storage_type: int, opset: int,
                             fresh: Fresh) -> list[onnx.NodeProto]:
    """Nodes computing ``node``'s outputs from ``inputs`` (score weight, norm weight, then sources), named
    ``<node.name>/...``."""
    score_weight, norm_weight, sources = inputs[0], inputs[1], inputs[2:]
    h = node.output[1] if len(node.output) > 1 and node.output[1] else fresh("aggregate")
    aggregate = oh.make_node(AGGREGATE, [score_weight, *sources], [h], name=node.name, eps=attribute(node, "eps"))
    nodes = decompose_aggregate(aggregate, [score_weight, *sources], storage_type, opset, fresh)

    b = NodeBuilder(f"{node.name}/norm", fresh)
    hf = b.as_float(h, storage_type, "h_f32")
    axes_last = b.constant("axes_last", oh.make_tensor("axes", TensorProto.INT64, [1], [-1]))
    square = b.one("Mul", [hf, hf], "square")
    if opset >= 18:
        mean_sq = b.one("ReduceMean", [square, axes_last], "mean_sq", keepdims=1)
    else:
        mean_sq = b.one("ReduceMean", [square], "mean_sq", axes=[-1], keepdims=1)
    ms_eps = b.one("Add", [mean_sq, b.scalar("norm_eps", float(attribute(node, "norm_eps")))], "ms_eps")
    inv_rms = b.one("Reciprocal", [b.one("Sqrt", [ms_eps], "rms")], "inv_rms")
    normed = b.one("Mul", [hf, inv_rms], "normed")
    b.finish(b.one("Mul", [normed, norm_weight], "scaled"), node.output[0], storage_type)
    return [*nodes, *b.nodes]
