"""ResidualScoreAttention written in standard ONNX ops (the ``portable`` target, SPEC 4).

``MatMul(q, k^T)`` and ``Mul(scale)``, ``Add(prev_scores)`` (the ``scores`` output), ``Div(logit_divisor)``,
``Add(mask_bias)``, ``Softmax`` over the keys and ``MatMul(p, v)``, all in float32 with a Cast back: the same
order of operations as the PyTorch and NumPy references.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.graphs.onnx_utils import attribute

MIN_OPSET = 17


def decompose_residual_attention(
    node: onnx.NodeProto, storage_type: int, opset: int, fresh
) -> list[onnx.NodeProto]:
    """Nodes computing ``node``'s outputs from its inputs; every new node is named ``<node.name>/...``."""
    if opset < MIN_OPSET:
        raise ValueError(f"the portable decomposition needs default opset >= {MIN_OPSET}, the model has {opset}")
    prefix = node.name
    q, k, v, prev, mask = (*node.input, "", "")[:5]
    out_name, scores_name = (*node.output, "")[:2]
    out: list[onnx.NodeProto] = []

    def add(op: str, inputs: list[str], hint: str, **attrs) -> str:
        output = fresh(hint)
        out.append(oh.make_node(op, inputs, [output], name=f"{prefix}/{hint}_{len(out)}", **attrs))
        return output

    def scalar(hint: str, value: float) -> str:
        return add("Constant", [], hint, value=oh.make_tensor(hint, TensorProto.FLOAT, [], [value]))

    def as_float(name: str, hint: str) -> str:
        return name if storage_type == TensorProto.FLOAT else add("Cast", [name], hint, to=TensorProto.FLOAT)

    key_t = add("Transpose", [as_float(k, "k_f32")], "k_t", perm=[0, 1, 3, 2])
    raw = add("MatMul", [as_float(q, "q_f32"), key_t], "qk")
    scores = add("Mul", [raw, scalar("scale", float(attribute(node, "scale")))], "scaled")
    if prev:
        scores = add("Add", [scores, prev], "scores")
    divisor = float(attribute(node, "logit_divisor"))
    logits = scores if divisor == 1.0 else add("Div", [scores, scalar("divisor", divisor)], "logits")
    if mask:
        logits = add("Add", [logits, mask], "masked")
    probs = add("Softmax", [logits], "probs", axis=-1)
    mixed = add("MatMul", [probs, as_float(v, "v_f32")], "mixed")
    if scores_name:
        out.append(oh.make_node("Identity", [scores], [scores_name], name=f"{prefix}/scores_out"))
    if storage_type == TensorProto.FLOAT:
        out.append(oh.make_node("Identity", [mixed], [out_name], name=f"{prefix}/out"))
    else:
        out.append(oh.make_node("Cast", [mixed], [out_name], name=f"{prefix}/out", to=storage_type))
    return out
