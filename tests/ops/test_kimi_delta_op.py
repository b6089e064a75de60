"""``attnres::kimi_delta_attention`` computes docs/op-set.md#kimideltaattention: against a float64 NumPy reference,
closed-form cases, state chaining, and its portable decomposition and node validation on ONNX."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.errors import OpSetError
from attnres_export.graphs.targets import convert
from attnres_export.graphs.validate import validate_attnres_nodes
from attnres_export.ops import kimi_delta_attention, kimi_delta_attention_numpy, kimi_delta_attention_numpy_in
from attnres_export.ops.descriptors import KIMI_DELTA_ATTENTION_OP, PLUGIN_ATTRIBUTES

SHAPES = [  # B, T, H, dk, dv
    (2, 9, 3, 8, 8),
    (1, 1, 2, 5, 3),  # one token, odd head sizes, dv != dk
    (3, 17, 1, 4, 6),
]
BOUNDS = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
EPS = 1e-6


def _operands(shape, dtype=torch.float32, seed: int = 0):
    b, t, h, dk, dv = shape
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, t, h, dk, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(b, t, h, dv, generator=gen).to(dtype)
    g = torch.log(torch.rand(b, t, h, dk, generator=gen) * 0.6 + 0.4)  # decays in (0.4, 1)
    beta = torch.rand(b, t, h, generator=gen).to(dtype)
    state = torch.randn(b, h, dk, dv, generator=gen)
    return q, k, v, g, beta, state


def _float64(*operands, scale):
    arrays = [t.double().numpy() for t in operands]
    return kimi_delta_attention_numpy_in(np.float64, *arrays, scale, EPS)


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


@pytest.mark.parametrize("dtype", list(BOUNDS), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_op_matches_float64_reference_from_the_storage_values(shape, dtype) -> None:
    operands = _operands(shape, dtype)
    scale = shape[3] ** -0.5
    out, state = kimi_delta_attention(*operands, scale, EPS)
    want_out, want_state = _float64(*operands, scale=scale)
    assert out.dtype == dtype and out.shape == (*shape[:3], shape[4])
    assert state.dtype == torch.float32 and state.shape == (shape[0], shape[2], shape[3], shape[4])
    assert _rel(state.numpy(), want_state) < 1e-5
    assert _rel(out.float().numpy(), want_out) < BOUNDS[dtype]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_numpy_reference_and_torch_op_agree_in_float32(shape) -> None:
    operands = _operands(shape, seed=3)
    out, state = kimi_delta_attention(*operands, 0.4, EPS)
    np_out, np_state = kimi_delta_attention_numpy(*(t.numpy() for t in operands), 0.4, EPS)
    assert np_out.dtype == np_state.dtype == np.float32
    np.testing.assert_allclose(out.numpy(), np_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state.numpy(), np_state, rtol=1e-5, atol=1e-6)


def test_one_token_from_zero_state_with_full_write_reads_back_its_value() -> None:
    """S = k^ v^T, so out = scale * cos(q, k) * v: the closed form of a single delta-rule write."""
    q, k, v, g, _, _ = _operands((2, 1, 3, 6, 4), seed=5)
    beta, zero = torch.ones(2, 1, 3), torch.zeros(2, 3, 6, 4)
    out, state = kimi_delta_attention(q, k, v, g, beta, zero, 0.5, 0.0)
    cos = torch.nn.functional.cosine_similarity(q, k, dim=-1)
    torch.testing.assert_close(out, 0.5 * cos[..., None] * v)
    k_unit = k / k.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(state, k_unit[:, 0, :, :, None] * v[:, 0, :, None, :])


def test_zero_keys_only_decay_the_state_channel_wise() -> None:
    q, _, v, g, beta, state = _operands((1, 1, 2, 5, 3), seed=9)
    out, final = kimi_delta_attention(q, torch.zeros_like(q), v, g, beta, state, 1.0, EPS)
    decayed = torch.exp(g[:, 0])[..., None] * state
    torch.testing.assert_close(final, decayed)
    q_unit = q[:, 0] / torch.sqrt((q[:, 0] ** 2).sum(-1, keepdim=True) + EPS)
    torch.testing.assert_close(out[:, 0], torch.einsum("bhk,bhkv->bhv", q_unit, decayed))


def test_running_two_parts_from_the_carried_state_equals_one_run() -> None:
    q, k, v, g, beta, state = _operands((2, 11, 2, 4, 5), seed=2)
    whole, final = kimi_delta_attention(q, k, v, g, beta, state, 0.5, EPS)
    first, middle = kimi_delta_attention(q[:, :4], k[:, :4], v[:, :4], g[:, :4], beta[:, :4], state, 0.5, EPS)
    second, end = kimi_delta_attention(q[:, 4:], k[:, 4:], v[:, 4:], g[:, 4:], beta[:, 4:], middle, 0.5, EPS)
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole)
    torch.testing.assert_close(end, final)


def test_float64_operands_stay_float64() -> None:
    operands = [t.double() for t in _operands((1, 3, 2, 4, 4))]
    out, state = kimi_delta_attention(*operands, 0.5, EPS)
    assert out.dtype == state.dtype == torch.float64


def test_mismatched_state_is_refused() -> None:
    q, k, v, g, beta, state = _operands((1, 3, 2, 4, 5))
    with pytest.raises(ValueError, match="initial_state"):
        kimi_delta_attention(q, k, v, g, beta, state.transpose(-1, -2), 0.5, EPS)


def _node_model(shape, storage: int = TensorProto.FLOAT, opset: int = 18, declared: bool = True,
                **attrs) -> onnx.ModelProto:
    _, _, h, dk, dv = shape
    dims = {"q": ["B", "T", h, dk], "k": ["B", "T", h, dk], "v": ["B", "T", h, dv], "g": ["B", "T", h, dk],
            "beta": ["B", "T", h], "initial_state": ["B", h, dk, dv]}
    storage_inputs = {"q", "k", "v", "beta"}
    inputs = [oh.make_tensor_value_info(name, storage if name in storage_inputs else TensorProto.FLOAT,
                                        shape_ if declared else None) for name, shape_ in dims.items()]
    outputs = [oh.make_tensor_value_info("out", storage, None), oh.make_tensor_value_info("final_state",
                                                                                         TensorProto.FLOAT, None)]
    attributes = {"scale": dk ** -0.5, "l2norm_eps": EPS, **attrs}
    node = oh.make_node("KimiDeltaAttention", list(dims), ["out", "final_state"], name="kda", domain="attnres",
                        **{k: v for k, v in attributes.items() if v is not None}, **PLUGIN_ATTRIBUTES)
    graph = oh.make_graph([node], "g", inputs, outputs)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset), oh.make_opsetid("attnres", 1)])


def _feeds(shape, seed: int = 0) -> dict[str, np.ndarray]:
    names = ("q", "k", "v", "g", "beta", "initial_state")
    return {n: t.numpy() for n, t in zip(names, _operands(shape, seed=seed), strict=True)}


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("tokens", [1, 6, 23])
def test_portable_decomposition_matches_float64_reference_on_onnxruntime(opset: int, tokens: int) -> None:
    """One portable graph (a Scan over the token axis) serves every number of tokens, the single step too."""
    portable = convert(_node_model((2, tokens, 3, 8, 6), opset=opset), "portable")
    assert {n.op_type for n in portable.graph.node} >= {"Scan"}
    assert not [n for n in portable.graph.node if n.domain == "attnres"]
    with OnnxRuntimeRunner(portable) as runner:
        for batch in (1, 2):
            feeds = _feeds((batch, tokens, 3, 8, 6), seed=tokens)
            got = runner.infer(feeds)
            want_out, want_state = kimi_delta_attention_numpy_in(np.float64, *feeds.values(), 8 ** -0.5, EPS)
            assert _rel(got["out"], want_out) < 1e-5
            assert _rel(got["final_state"], want_state) < 1e-5


@pytest.mark.parametrize("target", ["tensorrt", "portable"])
def test_a_node_that_leaves_out_the_final_state_still_runs(target: str) -> None:
    model = _node_model((2, 4, 2, 4, 3))
    del model.graph.node[0].output[1]
    del model.graph.output[1]
    feeds = _feeds((2, 4, 2, 4, 3))
    with OnnxRuntimeRunner(convert(model, target)) as runner:
        got = runner.infer(feeds)
    want_out, _ = kimi_delta_attention_numpy_in(np.float64, *feeds.values(), 0.5, EPS)
    assert list(got) == ["out"] and _rel(got["out"], want_out) < 1e-5


def test_convert_round_trip_through_portable_restores_the_node() -> None:
    fused = _node_model((1, 3, 2, 4, 4))
    back = convert(convert(fused, "portable"), "tensorrt")
    (node,) = back.graph.node
    assert (node.op_type, node.domain, list(node.input), list(node.output)) == (
        "KimiDeltaAttention", "attnres", ["q", "k", "v", "g", "beta", "initial_state"], ["out", "final_state"])
    assert {a.name for a in node.attribute} == {"scale", "l2norm_eps", *PLUGIN_ATTRIBUTES}


@pytest.mark.parametrize(("attrs", "message"), [
    ({"l2norm_eps": None}, "missing attribute l2norm_eps"),
    ({"l2norm_eps": -1.0}, "attribute l2norm_eps is -1.0; it must be a finite number >= 0"),
    ({"scale": float("inf")}, "attribute scale is inf; it must be a finite number"),
])
def test_bad_attributes_are_refused_naming_the_node(attrs: dict, message: str) -> None:
    with pytest.raises(OpSetError, match=f"node 'kda' \\(KimiDeltaAttention\\): {message}"):
        validate_attnres_nodes(_node_model((1, 3, 2, 4, 4), **attrs))


def test_a_missing_state_input_is_refused() -> None:
    model = _node_model((1, 3, 2, 4, 4))
    model.graph.node[0].input[5] = ""
    with pytest.raises(OpSetError, match="missing input initial_state"):
        validate_attnres_nodes(model)


@pytest.mark.parametrize(("shapes", "message"), [
    ({"beta": [2, 3, 2, 1]}, "beta has rank 4, not 3"),
    ({"initial_state": [2, 2, 4, 5]}, "V is 4 and 5"),
    ({"k": [2, 3, 3, 4]}, "H is 2 and 3"),
])
def test_shapes_that_do_not_fit_are_refused(shapes: dict, message: str) -> None:
    model = _node_model((2, 3, 2, 4, 4))
    for value in model.graph.input:
        if value.name in shapes:
            value.CopyFrom(oh.make_tensor_value_info(value.name, value.type.tensor_type.elem_type, shapes[value.name]))
    with pytest.raises(OpSetError, match=message):
        validate_attnres_nodes(model)


def test_the_descriptor_declares_no_plugin_yet() -> None:
    assert not KIMI_DELTA_ATTENTION_OP.has_plugin
