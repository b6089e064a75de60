"""KimiDeltaAttention in standard ONNX ops, chunked (docs/op-set.md#kimideltaattention)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from attnres_export.ops.onnx_nodes import Fresh, NodeBuilder, attribute

CHUNK = 64


def decompose_kimi_delta_chunked(node: onnx.NodeProto, inputs: list[str], storage_type: int, opset: int,
                                 fresh: Fresh, chunk: int = CHUNK) -> list[onnx.NodeProto]:
    b = NodeBuilder(node.name, fresh)
    q, k, v, g, beta, initial_state = inputs
    out_name, state_name = node.output
    eps = b.scalar("l2norm_eps", float(attribute(node, "l2norm_eps")))

    def ints(hint: str, *values: int) -> str:
        return b.constant(hint, oh.make_tensor(hint, TensorProto.INT64, [len(values)], list(values)))

    def tensor(hint: str, array: np.ndarray) -> str:
        return b.constant(hint, numpy_helper.from_array(array, hint))

    last = ints("axes_last", -1)

    def l2_normalised(x: str, hint: str) -> str:
        if opset >= 18:
            sumsq = b.one("ReduceSumSquare", [x, last], f"{hint}_sumsq", keepdims=1)
        else:
            sumsq = b.one("ReduceSumSquare", [x], f"{hint}_sumsq", axes=[-1], keepdims=1)
        norm = b.one("Sqrt", [b.one("Add", [sumsq, eps], f"{hint}_sumsq_eps")], f"{hint}_norm")
        return b.one("Div", [x, norm], f"{hint}_unit")

    q_f = b.one("Mul", [l2_normalised(b.as_float(q, storage_type, "q_f32"), "q"),
                        b.scalar("scale", float(attribute(node, "scale")))], "q_scaled")
    k_f = l2_normalised(b.as_float(k, storage_type, "k_f32"), "k")
    v_f = b.as_float(v, storage_type, "v_f32")
    beta_f = b.as_float(beta, storage_type, "beta_f32")

    shape = b.one("Shape", [v_f], "shape")
    tokens = b.one("Shape", [v_f], "tokens", start=1, end=2)
    batch = b.one("Shape", [v_f], "batch", start=0, end=1)
    size = ints("chunk", chunk)
    pad = b.one("Mod", [b.one("Sub", [size, b.one("Mod", [tokens, size], "rem")], "short"), size], "pad")
    zeros = {n: ints(f"zeros{n}", *[0] * n) for n in (1, 2, 4, 5)}
    pads4 = b.one("Concat", [zeros[5], pad, zeros[2]], "pads4", axis=0)
    pads3 = b.one("Concat", [zeros[4], pad, zeros[1]], "pads3", axis=0)

    def chunked(x: str, hint: str, dim_source: str) -> str:
        padded = b.one("Pad", [x, pads4], f"{hint}_padded")
        tail = b.one("Shape", [dim_source], f"{hint}_tail", start=2, end=4)
        target = b.one("Concat", [batch, ints(f"{hint}_n_c", -1, chunk), tail], f"{hint}_chunks_shape", axis=0)
        return b.one("Transpose", [b.one("Reshape", [padded, target], f"{hint}_chunks")], f"{hint}_bhnc",
                     perm=[0, 3, 1, 2, 4])

    scanned = [chunked(q_f, "q", q_f), chunked(k_f, "k", k_f), chunked(v_f, "v", v_f), chunked(g, "g", g)]
    beta_padded = b.one("Pad", [beta_f, pads3], "beta_padded")
    heads = b.one("Shape", [beta_f], "heads", start=2, end=3)
    beta_target = b.one("Concat", [batch, ints("beta_n_c", -1, chunk), heads], "beta_chunks_shape", axis=0)
    scanned.append(b.one("Transpose", [b.one("Reshape", [beta_padded, beta_target], "beta_chunks")], "beta_bhnc",
                         perm=[0, 3, 1, 2]))

    lower = np.tril(np.ones((chunk, chunk), dtype=bool))
    consts = {
        "incl": tensor("incl_mask", lower[:, :, None]),
        "incl_f": tensor("incl_f", lower.astype(np.float32)),
        "strict_f": tensor("strict_f", np.tril(np.ones((chunk, chunk), np.float32), -1)),
        "eye": tensor("eye", np.eye(chunk, dtype=np.float32)),
        "neg_inf": b.scalar("neg_inf", -np.inf),
        "ax_m1": ints("ax_m1", -1), "ax_m2": ints("ax_m2", -2), "ax_m3": ints("ax_m3", -3),
        "cum_axis": b.constant("cum_axis", oh.make_tensor("cum_axis", TensorProto.INT64, [], [-2])),
        "last_start": ints("last_start", -1), "last_end": ints("last_end", chunk),
    }
    levels = []
    span = 1
    while span < chunk:
        idx = np.arange(chunk) // span
        mask = ((idx[:, None] // 2 == idx[None, :] // 2) & (idx[:, None] % 2 == 1) & (idx[None, :] % 2 == 0))
        levels.append(tensor(f"level{span}", mask.astype(np.float32)))
        span *= 2

    rows = fresh("out_rows")
    b.nodes.append(oh.make_node(
        "Scan", [initial_state, *scanned], [state_name, rows], name=f"{node.name}/scan_{len(b.nodes)}",
        body=_chunk_body(node.name, fresh, consts, levels), num_scan_inputs=len(scanned),
        scan_input_axes=[2] * len(scanned), scan_output_axes=[2],
    ))
    merged = b.one("Transpose", [rows], "out_bnchd", perm=[0, 2, 3, 1, 4])
    flat_shape = b.one("Concat", [batch, ints("minus_one", -1), b.one("Shape", [v_f], "v_tail", start=2, end=4)],
                       "flat_shape", axis=0)
    flat = b.one("Reshape", [merged, flat_shape], "out_flat")
    cropped = b.one("Slice", [flat, zeros[1], tokens, ints("axis_tokens", 1)], "out_cropped")
    del shape
    b.finish(cropped, out_name, storage_type)
    return b.nodes


def _chunk_body(prefix: str, fresh: Fresh, c: dict[str, str], levels: list[str]) -> onnx.GraphProto:
    b = NodeBuilder(f"{prefix}/chunk", fresh)
    state, q, k, v, g, beta = (fresh(f"chunk_{h}") for h in ("state", "q", "k", "v", "g", "beta"))
    gc = b.one("CumSum", [g, c["cum_axis"]], "gc")
    diff = b.one("Sub", [b.one("Unsqueeze", [gc, c["ax_m2"]], "gc_i"), b.one("Unsqueeze", [gc, c["ax_m3"]], "gc_j")],
                 "diff")
    decay = b.one("Exp", [b.one("Where", [c["incl"], diff, c["neg_inf"]], "diff_masked")], "decay")
    k_beta = b.one("Mul", [k, b.one("Unsqueeze", [beta, c["ax_m1"]], "beta_col")], "k_beta")
    k_j = b.one("Unsqueeze", [k, c["ax_m3"]], "k_j")

    def pairwise(left: str, hint: str) -> str:
        prod = b.one("Mul", [b.one("Mul", [b.one("Unsqueeze", [left, c["ax_m2"]], f"{hint}_i"), k_j], f"{hint}_kk"),
                             decay], f"{hint}_decayed")
        return b.one("ReduceSum", [prod, c["ax_m1"]], f"{hint}_sum", keepdims=0)

    a_kk = b.one("Mul", [pairwise(k_beta, "akk"), c["strict_f"]], "a_kk")
    a_qk = b.one("Mul", [pairwise(q, "aqk"), c["incl_f"]], "a_qk")
    inverse = b.one("Sub", [c["eye"], b.one("Mul", [a_kk, levels[0]], "off0")], "inv0")
    for n, level in enumerate(levels[1:], 1):
        off = b.one("Mul", [a_kk, level], f"off{n}")
        inverse = b.one("Sub", [inverse, b.one("MatMul", [b.one("MatMul", [inverse, off], f"l{n}"), inverse],
                                               f"lr{n}")], f"inv{n}")
    beta_col = b.one("Unsqueeze", [beta, c["ax_m1"]], "beta_col2")
    u = b.one("MatMul", [inverse, b.one("Mul", [v, beta_col], "v_beta")], "u")
    eg = b.one("Exp", [gc], "eg")
    w = b.one("MatMul", [inverse, b.one("Mul", [k_beta, eg], "k_beta_decay")], "w")
    v_new = b.one("Sub", [u, b.one("MatMul", [w, state], "w_s")], "v_new")
    out = b.one("Add", [b.one("MatMul", [b.one("Mul", [q, eg], "q_decay"), state], "inter"),
                        b.one("MatMul", [a_qk, v_new], "intra")], "out")
    g_last = b.one("Slice", [gc, c["last_start"], c["last_end"], c["ax_m2"]], "g_last")
    carried = b.one("Mul", [state, b.one("Transpose", [b.one("Exp", [g_last], "e_last")], "e_last_col",
                                         perm=[0, 1, 3, 2])], "carried")
    k_tail = b.one("Mul", [k, b.one("Exp", [b.one("Sub", [g_last, gc], "to_last")], "e_to_last")], "k_tail")
    state_out = b.one("Add", [carried, b.one("MatMul", [b.one("Transpose", [k_tail], "k_tail_t", perm=[0, 1, 3, 2]),
                                                        v_new], "written")], "state_out")
    inputs = [oh.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in (state, q, k, v, g, beta)]
    outputs = [oh.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in (state_out, out)]
    return oh.make_graph(b.nodes, f"{prefix}/chunk", inputs, outputs)
