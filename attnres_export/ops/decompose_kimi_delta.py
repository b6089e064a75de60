"""KimiDeltaAttention written in standard ONNX ops: the ``portable`` target (docs/op-set.md#kimideltaattention).

Everything that does not depend on the state is computed for all T tokens at once, outside the loop: the
casts to float32, the L2 norms of q and k, ``scale``, ``exp(g)``, ``beta * k`` and the row/column views the
loop multiplies. The recurrence is one ``Scan`` over the token axis whose body is six nodes per token:
``S * exp(g_t)``, ``k_t^T S``, ``v_t - k_t^T S``, ``(beta_t k_t) (v_t - k_t^T S)``, the add, and ``q_t^T S``:
the order of operations of the PyTorch and NumPy references. A ``Scan`` takes any number of tokens, so one
graph serves a prefill of T tokens and the single-token step (docs/models.md#kimi-delta-attention says why
this form and not a chunked one).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.ops.onnx_nodes import Fresh, NodeBuilder, attribute

TOKEN_AXIS = 1
"""q, k, v, g, beta and out are ``[B, T, H, d]``: the Scan runs over axis 1."""


def decompose_kimi_delta(node: onnx.NodeProto, inputs: list[str], storage_type: int, opset: int,
                         fresh: Fresh) -> list[onnx.NodeProto]:
    """Nodes computing ``node``'s outputs from ``inputs`` (q, k, v, g, beta, initial_state), named
    ``<node.name>/...``."""
    b = NodeBuilder(node.name, fresh)
    q, k, v, g, beta, initial_state = inputs
    out_name, state_name = (*node.output, "")[:2]
    state_name = state_name or fresh("final_state_unused")
    scale = float(attribute(node, "scale"))
    eps = b.scalar("l2norm_eps", float(attribute(node, "l2norm_eps")))

    def axes(hint: str, *values: int) -> str:
        return b.constant(hint, oh.make_tensor(hint, TensorProto.INT64, [len(values)], list(values)))

    last, row = axes("axes_last", -1), axes("axes_row", -2)  # Unsqueeze at -1 makes a column, at -2 a row

    def l2_normalised(x: str, hint: str) -> str:
        if opset >= 18:
            sumsq = b.one("ReduceSumSquare", [x, last], f"{hint}_sumsq", keepdims=1)
        else:
            sumsq = b.one("ReduceSumSquare", [x], f"{hint}_sumsq", axes=[-1], keepdims=1)
        norm = b.one("Sqrt", [b.one("Add", [sumsq, eps], f"{hint}_sumsq_eps")], f"{hint}_norm")
        return b.one("Div", [x, norm], f"{hint}_unit")

    q_unit = l2_normalised(b.as_float(q, storage_type, "q_f32"), "q")
    k_unit = l2_normalised(b.as_float(k, storage_type, "k_f32"), "k")
    q_scaled = b.one("Mul", [q_unit, b.scalar("scale", scale)], "q_scaled")
    beta_col = b.one("Unsqueeze", [b.as_float(beta, storage_type, "beta_f32"), last], "beta_col")
    scanned = [
        b.one("Unsqueeze", [b.one("Exp", [g], "decay"), last], "decay_col"),      # [B,T,H,dk,1]
        b.one("Unsqueeze", [k_unit, row], "k_row"),                                # [B,T,H,1,dk]
        b.one("Unsqueeze", [b.as_float(v, storage_type, "v_f32"), row], "v_row"),  # [B,T,H,1,dv]
        b.one("Unsqueeze", [b.one("Mul", [k_unit, beta_col], "k_beta"), last], "k_beta_col"),  # [B,T,H,dk,1]
        b.one("Unsqueeze", [q_scaled, row], "q_row"),                              # [B,T,H,1,dk]
    ]
    rows = fresh("out_rows")
    b.nodes.append(oh.make_node(
        "Scan", [initial_state, *scanned], [state_name, rows], name=f"{node.name}/scan_{len(b.nodes)}",
        body=_step(node.name, fresh), num_scan_inputs=len(scanned), scan_input_axes=[TOKEN_AXIS] * len(scanned),
        scan_output_axes=[TOKEN_AXIS],
    ))
    mixed = b.one("Squeeze", [rows, axes("axes_out", 3)], "mixed")  # [B,T,H,1,dv] -> [B,T,H,dv]
    b.finish(mixed, out_name, storage_type)
    return b.nodes


def _step(prefix: str, fresh: Fresh) -> onnx.GraphProto:
    """The Scan body: one token's update of the state ``S [B,H,dk,dv]`` and its output row ``q_t^T S``."""
    names = {hint: fresh(f"step_{hint}") for hint in (
        "state", "decay", "k_row", "v_row", "k_beta", "q_row", "decayed", "recalled", "correction", "written",
        "state_out", "out_row")}
    n = names

    def step(op: str, inputs: list[str], output: str) -> onnx.NodeProto:
        return oh.make_node(op, [n[i] for i in inputs], [n[output]], name=f"{prefix}/step/{output}")

    nodes = [
        step("Mul", ["state", "decay"], "decayed"),
        step("MatMul", ["k_row", "decayed"], "recalled"),
        step("Sub", ["v_row", "recalled"], "correction"),
        step("MatMul", ["k_beta", "correction"], "written"),
        step("Add", ["decayed", "written"], "state_out"),
        step("MatMul", ["q_row", "state_out"], "out_row"),
    ]
    inputs = [oh.make_tensor_value_info(n[h], TensorProto.FLOAT, None)
              for h in ("state", "decay", "k_row", "v_row", "k_beta", "q_row")]
    outputs = [oh.make_tensor_value_info(n[h], TensorProto.FLOAT, None) for h in ("state_out", "out_row")]
    return oh.make_graph(nodes, f"{prefix}/step", inputs, outputs)
