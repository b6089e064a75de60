"""Kimi Delta Attention as ONNX Runtime's ``LinearAttention`` and ``CausalConvWithState``: the one-layer export of
tests/models/kimi/test_kda_onnx.py, rewritten, runs on plain ONNX Runtime and computes what transformers' own layer
computes, from the zero state and from transformers' cache; what the rewrites cannot prove equal stays as it was."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper
from torch import nn
from transformers import DynamicCache, KimiLinearConfig

from attnres_export.dims import DimRange
from attnres_export.exporter.to_onnx import export_module
from attnres_export.graphs.onnxruntime_ops.kda import causal_convolutions, linear_attention
from attnres_export.graphs.targets import convert
from attnres_export.ops.numpy_ref import kimi_delta_attention_numpy
from attnres_export.ops.opset import DOMAIN, KIMI_DELTA_ATTENTION, PLUGIN_NAMESPACE, PLUGIN_VERSION
from tests.conftest import slow_after
from tests.models.kimi.reference import CONFIG_JSON, hidden, our_layer, rel_l2, transformers_layer
from tests.models.kimi.test_kda_onnx import STATE_NAMES, _transformers_state, export_layer

HEADS, HEAD_DIM, CONV_SIZE = 3, 8, 4
CHANNELS = HEADS * HEAD_DIM


def _rewrite(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int, int]:
    return model, causal_convolutions(model), linear_attention(model)


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def _fresh_cache() -> DynamicCache:
    return DynamicCache(config=KimiLinearConfig(**CONFIG_JSON))


@pytest.fixture(scope="module")
def float32_layer() -> tuple[nn.Module, onnx.ModelProto, int, int]:
    reference = transformers_layer(seed=11)
    return reference, *_rewrite(export_layer(reference)["tensorrt"])


@pytest.fixture(scope="module")
def float16_layer() -> tuple[nn.Module, onnx.ModelProto, int, int]:
    reference = transformers_layer(seed=12, dtype=torch.float16)
    return reference, *_rewrite(export_layer(reference)["tensorrt"])


class _ZeroState(nn.Module):
    """The layer from the zero state, only its output: the plain (no-past) graph, whose caches are zeros."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states):
        return self.layer(hidden_states)[0]


@pytest.fixture(scope="module")
def plain_layer() -> tuple[nn.Module, onnx.ModelProto, int, int]:
    reference = transformers_layer(seed=13)
    sizes = DimRange(1, 4, 256)
    model = ir.to_proto(export_module(_ZeroState(our_layer(reference)).eval(), {"hidden_states": hidden(2, 5)},
                                      {"hidden_states": {0: ("batch", sizes), 1: ("seq", sizes)}}, ["out"], opset=18))
    return reference, *_rewrite(convert(model, "tensorrt"))


def _assert_fully_rewritten(model: onnx.ModelProto, conv: int, attention: int) -> None:
    ops = _ops(model)
    assert (conv, attention) == (3, 1)
    assert (ops["CausalConvWithState"], ops["LinearAttention"]) == (3, 1)
    assert not ops["KimiDeltaAttention"] and not ops["Conv"] and not ops["Slice"]
    assert not [n for n in model.graph.node if n.domain == DOMAIN]
    assert any(o.domain == "com.microsoft" for o in model.opset_import)
    onnx.checker.check_model(model, full_check=True)


def _from_zero_state(reference: nn.Module, model: onnx.ModelProto, batch: int, tokens: int, seed: int,
                     dtype: torch.dtype = torch.float32) -> tuple[dict[str, np.ndarray], torch.Tensor, DynamicCache]:
    x = hidden(batch, tokens, seed=seed, dtype=dtype)
    zeros = our_layer(reference).initial_state(batch)
    cache = _fresh_cache()
    with torch.no_grad():
        want = reference(x, cache_params=cache)
    feeds = {"hidden_states": x.numpy(), **{n: t.numpy() for n, t in zip(STATE_NAMES, zeros, strict=True)}}
    return _run(model, feeds), want, cache


def test_each_kda_layer_becomes_one_linear_attention_and_three_causal_convolutions(float32_layer) -> None:
    _, model, conv, attention = float32_layer
    _assert_fully_rewritten(model, conv, attention)
    fused = {n.op_type: n for n in model.graph.node if n.domain == "com.microsoft"}
    attrs = {a.name: oh.get_attribute_value(a) for a in fused["LinearAttention"].attribute}
    assert attrs["update_rule"] == b"gated_delta" and attrs["q_num_heads"] == attrs["kv_num_heads"] == HEADS
    assert attrs["scale"] == pytest.approx(HEAD_DIM**-0.5)
    convs = [n for n in model.graph.node if n.op_type == "CausalConvWithState"]
    assert [n.input[3] for n in convs] == list(STATE_NAMES[1:])  # the caches feed the op directly
    assert [n.output[1] for n in convs] == [f"{name}_out" for name in STATE_NAMES[1:]]


@pytest.mark.parametrize(("batch", "tokens"), slow_after([(3, 7), (1, 1), (1, 7), (3, 1), (1, 71)]))
def test_rewritten_float32_layer_from_zero_state_matches_transformers(float32_layer, batch: int, tokens: int) -> None:
    """71 tokens: past transformers' 64-token chunk and LinearAttention's default chunk."""
    reference, model, *_ = float32_layer
    got, want, cache = _from_zero_state(reference, model, batch, tokens, seed=tokens)
    assert rel_l2(got["out"], want) < 1e-5
    for name, value in _transformers_state(cache).items():
        assert rel_l2(got[f"{name}_out"], value) < 1e-5, name


@pytest.mark.parametrize(("batch", "tokens"), slow_after([(3, 1), (1, 1), (1, 5), (3, 5)]))
def test_rewritten_float32_layer_continuing_from_transformers_cache_matches_transformers(
        float32_layer, batch: int, tokens: int) -> None:
    reference, model, *_ = float32_layer
    cache = _fresh_cache()
    more = hidden(batch, tokens, seed=21)
    with torch.no_grad():
        reference(hidden(batch, 9, seed=20), cache_params=cache)
        feeds = {"hidden_states": more.numpy(), **_transformers_state(cache)}
        want = reference(more, cache_params=cache)
    got = _run(model, feeds)
    assert rel_l2(got["out"], want) < 1e-5
    for name, value in _transformers_state(cache).items():
        assert rel_l2(got[f"{name}_out"], value) < 1e-5, name


@pytest.mark.slow
def test_float16_layer_is_rewritten_to_float32_kernels_between_casts(float16_layer) -> None:
    """The op computes in float32 from the stored values; the kernels are given float32 (weights stay float32)."""
    _, model, conv, attention = float16_layer
    _assert_fully_rewritten(model, conv, attention)
    types = {v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    types |= {i.name: i.data_type for i in model.graph.initializer}
    types |= {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    for node in model.graph.node:
        if node.domain == "com.microsoft":
            assert {types[i] for i in node.input if i} == {TP.FLOAT}, node.name
    convs = [n for n in model.graph.node if n.op_type == "CausalConvWithState"]
    # the model's own SiLU after the rounding to float16, as before
    assert {a.s for n in convs for a in n.attribute if a.name == "activation"} == {b"none"}


@pytest.mark.slow
@pytest.mark.parametrize(("batch", "tokens"), [(1, 1), (3, 7)])
def test_rewritten_float16_layer_matches_transformers_in_float16(float16_layer, batch: int, tokens: int) -> None:
    reference, model, *_ = float16_layer
    got, want, cache = _from_zero_state(reference, model, batch, tokens, seed=4, dtype=torch.float16)
    assert rel_l2(got["out"].astype(np.float32), want.float()) < 5e-3
    more = hidden(batch, tokens, seed=5, dtype=torch.float16)
    with torch.no_grad():
        feeds = {"hidden_states": more.numpy(), **_transformers_state(cache)}
        want = reference(more, cache_params=cache)
    got = _run(model, feeds)
    assert rel_l2(got["out"].astype(np.float32), want.float()) < 5e-3
    assert rel_l2(got["recurrent_state_out"], cache.layers[0].recurrent_states[0].float()) < 5e-3


@pytest.mark.parametrize(("batch", "tokens"), slow_after([(3, 7), (1, 1)]))
def test_plain_layer_passes_no_zero_state_and_matches_transformers(plain_layer, batch: int, tokens: int) -> None:
    reference, model, conv, attention = plain_layer
    _assert_fully_rewritten(model, conv, attention)
    fused = [n for n in model.graph.node if n.domain == "com.microsoft"]
    assert all(n.input[3] == "" for n in fused)  # past_state absent: the kernels' zeros
    assert not _ops(model)["ConstantOfShape"]
    x = hidden(batch, tokens, seed=30 + tokens)
    with torch.no_grad():
        want = reference(x, cache_params=_fresh_cache())
    assert rel_l2(_run(model, {"hidden_states": x.numpy()})["out"], want) < 1e-5


# Hand-built graphs: fast, and the cases an export never writes.

def _kda_graph(dims: tuple, scale: float = 0.35, with_g: bool = True) -> onnx.ModelProto:
    """One KimiDeltaAttention node on graph inputs of shape ``dims = (B, T, H, dk, dv)`` (a str is symbolic)."""
    b, t, h, dk, dv = dims
    shapes = {"q": [b, t, h, dk], "k": [b, t, h, dk], "v": [b, t, h, dv], "g": [b, t, h, dk], "beta": [b, t, h],
              "state": [b, h, dk, dv]}
    types = {"g": TP.FLOAT, "state": TP.FLOAT}
    inputs = [oh.make_tensor_value_info(n, types.get(n, TP.FLOAT), s) for n, s in shapes.items()]
    node = oh.make_node(KIMI_DELTA_ATTENTION, ["q", "k", "v", "g" if with_g else "", "beta", "state"],
                        ["out", "final_state"], domain=DOMAIN, name="kda", scale=scale, l2norm_eps=1e-6,
                        plugin_version=PLUGIN_VERSION, plugin_namespace=PLUGIN_NAMESPACE)
    graph = oh.make_graph([node], "g", inputs, [oh.make_tensor_value_info("out", TP.FLOAT, [b, t, h, dv]),
                                                oh.make_tensor_value_info("final_state", TP.FLOAT, [b, h, dk, dv])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid(DOMAIN, 1)])


def test_kda_node_with_static_heads_is_rewritten_and_matches_the_numpy_reference() -> None:
    """dk != dv, batch and sequence symbolic: the positive control of the hand-built cases below."""
    model = _kda_graph(("B", "T", 2, 6, 5))
    assert linear_attention(model) == 1
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(shape).astype(np.float32)
             for name, shape in (("q", (3, 7, 2, 6)), ("k", (3, 7, 2, 6)), ("v", (3, 7, 2, 5)), ("g", (3, 7, 2, 6)),
                                 ("beta", (3, 7, 2)), ("state", (3, 2, 6, 5)))}
    feeds["g"] = -np.abs(feeds["g"])
    feeds["beta"] = 1 / (1 + np.exp(-feeds["beta"]))
    got = _run(model, feeds)
    want = kimi_delta_attention_numpy(*(feeds[n] for n in ("q", "k", "v", "g", "beta", "state")), 0.35, 1e-6)
    assert rel_l2(got["out"], want[0]) < 1e-5 and rel_l2(got["final_state"], want[1]) < 1e-5


@pytest.mark.parametrize(("dims", "scale", "with_g"), [
    pytest.param(("B", "T", "H", 6, 5), 0.35, True, id="heads-unknown"),
    pytest.param(("B", "T", 2, "dk", 5), 0.35, True, id="head-dim-unknown"),
    pytest.param(("B", "T", 2, 6, 5), 0.0, True, id="scale-zero-the-kernel-reads-as-default"),
    pytest.param(("B", "T", 2, 6, 5), 0.35, False, id="no-g"),
])
def test_kda_node_the_rewrite_cannot_prove_equal_is_left_as_is(dims: tuple, scale: float, with_g: bool) -> None:
    model = _kda_graph(dims, scale, with_g)
    before = model.SerializeToString()
    assert linear_attention(model) == 0
    assert model.SerializeToString() == before


def _conv_graph(activation: str = "silu", cache_width: int = CONV_SIZE - 1, depthwise: bool = True,
                pads: tuple[int, int] = (0, 0), window_read_elsewhere: bool = False,
                slice_start: int = -(CONV_SIZE - 1)) -> onnx.ModelProto:
    """``window = Concat(cache, x)``, depthwise Conv, SiLU (or ``activation``), new cache = a Slice of the window."""
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((CHANNELS, 1 if depthwise else CHANNELS, CONV_SIZE)).astype(np.float32)
    inits = [numpy_helper.from_array(weight, "w"),
             *(numpy_helper.from_array(np.array([v], np.int64), n)
               for n, v in (("start", slice_start), ("end", 2**63 - 1), ("axis", -1), ("step", 1)))]
    nodes = [oh.make_node("Concat", ["cache", "x"], ["window"], axis=-1),
             oh.make_node("Conv", ["window", "w"], ["conv"], group=CHANNELS if depthwise else 1,
                          kernel_shape=[CONV_SIZE], pads=list(pads)),
             oh.make_node("Slice", ["window", "start", "end", "axis", "step"], ["new_cache"])]
    if activation == "silu":
        nodes += [oh.make_node("Sigmoid", ["conv"], ["gate"]), oh.make_node("Mul", ["conv", "gate"], ["y"])]
    else:
        nodes.append(oh.make_node(activation, ["conv"], ["y"]))
    outputs = [oh.make_tensor_value_info("y", TP.FLOAT, None), oh.make_tensor_value_info("new_cache", TP.FLOAT, None)]
    if window_read_elsewhere:
        nodes.append(oh.make_node("Identity", ["window"], ["window_copy"]))
        outputs.append(oh.make_tensor_value_info("window_copy", TP.FLOAT, None))
    inputs = [oh.make_tensor_value_info("cache", TP.FLOAT, ["B", CHANNELS, cache_width]),
              oh.make_tensor_value_info("x", TP.FLOAT, ["B", CHANNELS, "T"])]
    graph = oh.make_graph(nodes, "g", inputs, outputs, inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_short_convolution_is_rewritten_and_computes_what_it_computed() -> None:
    """The positive control of the hand-built cases below: the graph's own result, before and after."""
    model = _conv_graph()
    rng = np.random.default_rng(2)
    feeds = {"cache": rng.standard_normal((3, CHANNELS, CONV_SIZE - 1)).astype(np.float32),
             "x": rng.standard_normal((3, CHANNELS, 5)).astype(np.float32)}
    want = _run(model, feeds)
    assert causal_convolutions(model) == 1
    assert [n.op_type for n in model.graph.node] == ["CausalConvWithState"]
    got = _run(model, feeds)
    assert np.abs(got["y"] - want["y"]).max() < 1e-5
    assert np.array_equal(got["new_cache"], want["new_cache"])


@pytest.mark.parametrize("change", [
    pytest.param({"activation": "Relu"}, id="not-silu"),
    pytest.param({"cache_width": CONV_SIZE}, id="cache-wider-than-kernel-minus-one"),
    pytest.param({"depthwise": False}, id="not-depthwise"),
    pytest.param({"pads": (1, 0)}, id="padded"),
    pytest.param({"window_read_elsewhere": True}, id="window-read-elsewhere"),
    pytest.param({"slice_start": -2}, id="new-cache-not-the-last-columns"),
])
def test_convolution_not_matching_the_pattern_is_left_as_is(change: dict) -> None:
    model = _conv_graph(**change)
    before = model.SerializeToString()
    assert causal_convolutions(model) == 0
    assert model.SerializeToString() == before
