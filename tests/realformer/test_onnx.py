"""ResidualScoreAttention on the ONNX side: schema, ORT reference op, portable decomposition, types."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.graphs.schemas import register_schemas
from attnres_export.graphs.targets import convert
from attnres_export.graphs.types import value_types
from attnres_export.ops import DOMAIN, RESIDUAL_ATTENTION, residual_score_attention

B, H, TQ, TK, DH = 2, 2, 3, 5, 3
ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
SHAPES = {"q": [B, H, TQ, DH], "k": [B, H, TK, DH], "v": [B, H, TK, DH], "prev": [B, H, TQ, TK],
          "mask": [B, 1, 1, TK], "out": [B, H, TQ, DH], "scores": [B, H, TQ, TK]}
TORCH_TYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _single_node_model(dtype: str, prev: bool, mask: bool, divisor: float = 2.0) -> onnx.ModelProto:
    """One fused node, both outputs graph outputs (``out`` cast to float32 so ORT can feed and fetch it)."""
    storage = ONNX_TYPES[dtype]
    inputs = [oh.make_tensor_value_info(n, TensorProto.FLOAT, SHAPES[n]) for n in ("q", "k", "v")]
    casts = [oh.make_node("Cast", [n], [f"{n}_s"], to=storage) for n in ("q", "k", "v")]
    optional = []
    for present, name in ((prev, "prev"), (mask, "mask")):
        optional.append(name if present else "")
        if present:
            inputs.append(oh.make_tensor_value_info(name, TensorProto.FLOAT, SHAPES[name]))
    node = oh.make_node(RESIDUAL_ATTENTION, ["q_s", "k_s", "v_s", *optional], ["out_s", "scores"], name="rsa",
                        domain=DOMAIN, scale=DH**-0.5, logit_divisor=divisor, plugin_version="1",
                        plugin_namespace="attnres")
    back = oh.make_node("Cast", ["out_s"], ["out"], to=TensorProto.FLOAT)
    graph = oh.make_graph([*casts, node, back], "rsa", inputs,
                          [oh.make_tensor_value_info(n, TensorProto.FLOAT, SHAPES[n]) for n in ("out", "scores")])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid(DOMAIN, 1)])


def _feeds(prev: bool, mask: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal((B, H, TQ, DH)), "k": rng.standard_normal((B, H, TK, DH)),
             "v": rng.standard_normal((B, H, TK, DH))}
    if prev:
        feeds["prev"] = rng.standard_normal((B, H, TQ, TK))
    if mask:
        feeds["mask"] = np.where(np.arange(TK) >= 3, -10000.0, 0.0)[None, None, None, :].repeat(B, 0)
        feeds["mask"][0] = 0.0
    return {k: v.astype(np.float32) for k, v in feeds.items()}


def _torch_op(dtype: str, feeds: dict[str, np.ndarray], divisor: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    qkv = [torch.from_numpy(feeds[n]).to(TORCH_TYPES[dtype]) for n in ("q", "k", "v")]
    opt = [torch.from_numpy(feeds[n]) if n in feeds else None for n in ("prev", "mask")]
    out, scores = residual_score_attention(*qkv, *opt, DH**-0.5, divisor)
    return out.float().numpy(), scores.numpy()


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with OnnxRuntimeRunner(model) as runner:
        return runner.infer(feeds)


PATTERNS = [(False, False), (True, False), (False, True), (True, True)]


@pytest.mark.parametrize(("prev", "mask"), PATTERNS)
def test_checker_accepts_the_node_with_absent_optional_inputs(prev, mask) -> None:
    register_schemas()
    onnx.checker.check_model(_single_node_model("float16", prev, mask), full_check=True)


@pytest.mark.parametrize("dtype", list(ONNX_TYPES))
@pytest.mark.parametrize(("prev", "mask"), PATTERNS)
@pytest.mark.parametrize("target", ["tensorrt", "portable"])
def test_ort_reference_op_and_portable_decomposition_equal_the_torch_op(dtype, prev, mask, target) -> None:
    model = _single_node_model(dtype, prev, mask)
    if target == "portable":
        model = convert(model, "portable")
        assert all(n.domain == "" for n in model.graph.node)
    feeds = _feeds(prev, mask)
    got = _run(model, feeds)
    ref_out, ref_scores = _torch_op(dtype, feeds)
    np.testing.assert_allclose(got["scores"], ref_scores, rtol=1e-6, atol=1e-6)
    bound = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype]
    np.testing.assert_allclose(got["out"], ref_out, rtol=bound, atol=bound)


def test_portable_round_trip_restores_the_node_in_the_compact_tensorrt_spelling() -> None:
    register_schemas()
    fused = _single_node_model("float16", prev=False, mask=True, divisor=3.0)
    back = convert(convert(fused, "portable"), "tensorrt")
    [node] = [n for n in back.graph.node if n.domain == DOMAIN]
    [original] = [n for n in fused.graph.node if n.domain == DOMAIN]
    assert list(node.input) == ["q_s", "k_s", "v_s", "mask"]
    assert list(node.output) == list(original.output)
    expected = {a.name: oh.get_attribute_value(a) for a in original.attribute} | {"has_prev_scores": 0, "has_mask": 1}
    assert {a.name: oh.get_attribute_value(a) for a in node.attribute} == expected
    onnx.checker.check_model(back, full_check=True)


def test_compact_and_onnx_spellings_of_absent_inputs_compute_the_same() -> None:
    register_schemas()
    onnx_spelling = _single_node_model("float32", prev=False, mask=True)
    compact = convert(onnx_spelling, "tensorrt")
    feeds = _feeds(prev=False, mask=True)
    for name, value in _run(onnx_spelling, feeds).items():
        np.testing.assert_array_equal(_run(compact, feeds)[name], value)


def test_value_types_give_out_the_storage_type_and_scores_float32() -> None:
    types = value_types(_single_node_model("bfloat16", prev=True, mask=True))
    assert types["out_s"] == TensorProto.BFLOAT16
    assert types["scores"] == TensorProto.FLOAT


def test_decomposition_without_divisor_or_mask_has_no_div_or_mask_add() -> None:
    portable = convert(_single_node_model("float32", prev=False, mask=False, divisor=1.0), "portable")
    assert [n.op_type for n in portable.graph.node].count("Div") == 0
    assert [n.op_type for n in portable.graph.node].count("Add") == 0
