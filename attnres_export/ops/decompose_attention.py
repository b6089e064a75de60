"""ResidualScoreAttention written in standard ONNX ops: the ``portable`` target
(docs/op-set.md#residualscoreattention).

``MatMul(q, k^T)`` and ``Mul(scale)``, ``Add(prev_scores)`` (the ``scores`` output), ``Div(logit_divisor)``,
``Add(mask_bias)``, ``Softmax`` over the keys and ``MatMul(p, v)``, all in float32 with a Cast back: the same
order of operations as the PyTorch and NumPy references.
"""

from __future__ import annotations

import onnx
from onnx import helper as oh

from attnres_export.ops.onnx_nodes import Fresh, NodeBuilder, attribute


def decompose_residual_attention(node: onnx.NodeProto, inputs: list[str], storage_type: int, opset: int,
                                 fresh: Fresh) -> list[onnx.NodeProto]:
    """Nodes computing ``node``'s outputs from ``inputs`` (q, k, v, prev_scores, mask_bias; ``""`` when absent)."""
    b = NodeBuilder(node.name, fresh)
    q, k, v, prev, mask = inputs
    out_name, scores_name = (*node.output, "")[:2]

    key_t = b.one("Transpose", [b.as_float(k, storage_type, "k_f32")], "k_t", perm=[0, 1, 3, 2])
    raw = b.one("MatMul", [b.as_float(q, storage_type, "q_f32"), key_t], "qk")
    scores = b.one("Mul", [raw, b.scalar("scale", float(attribute(node, "scale")))], "scaled")
    if prev:
        scores = b.one("Add", [scores, prev], "scores")
    divisor = float(attribute(node, "logit_divisor"))
    logits = scores if divisor == 1.0 else b.one("Div", [scores, b.scalar("divisor", divisor)], "logits")
    if mask:
        logits = b.one("Add", [logits, mask], "masked")
    probs = b.one("Softmax", [logits], "probs", axis=-1)
    mixed = b.one("MatMul", [probs, b.as_float(v, storage_type, "v_f32")], "mixed")
    if scores_name:
        b.nodes.append(oh.make_node("Identity", [scores], [scores_name], name=f"{node.name}/scores_out"))
    b.finish(mixed, out_name, storage_type)
    return b.nodes
