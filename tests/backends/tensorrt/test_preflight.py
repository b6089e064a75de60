"""Preflight against a registry listing built by hand: each way a node can miss our plugin is named."""

from __future__ import annotations

from types import SimpleNamespace

import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.backends.tensorrt.preflight import preflight, registry_listing
from tests.backends.tensorrt.conftest import ATTNRES_CREATORS
from tests.backends.tensorrt.graphs import aggregate_model

REGISTRY = [("AttnResAggregate", "1", "attnres"), ("OtherPlugin", "1", "")]
LIBS = ["/opt/attnres/libattnres_trt.so"]


def messages(result) -> str:
    return "\n".join(result.lines())


def test_matching_creator_passes_with_no_findings():
    result = preflight(aggregate_model(), REGISTRY, (10, 8), LIBS)
    assert result.ok and result.problems == []
    assert result.requests[0].key == ("AttnResAggregate", "1", "attnres")


def test_version_mismatch_names_request_registry_and_libraries():
    result = preflight(aggregate_model(version="2"), REGISTRY, (10, 8), LIBS)
    text = messages(result)
    assert not result.ok
    assert "version mismatch" in text and "version '2'" in text and "version '1' namespace 'attnres'" in text
    assert LIBS[0] in text


def test_namespace_mismatch_is_reported_as_such():
    result = preflight(aggregate_model(namespace=None), REGISTRY, (10, 8), LIBS)
    assert not result.ok
    assert "namespace mismatch" in messages(result) and "namespace ''" in messages(result)


def test_missing_creator_says_which_libraries_were_loaded():
    result = preflight(aggregate_model(), [("OtherPlugin", "1", "")], (10, 8), [])
    assert not result.ok
    assert "no AttnResAggregate creator at all" in messages(result)
    assert "libraries loaded: none" in messages(result)


def test_an_op_without_a_plugin_yet_is_refused_by_name_with_the_portable_way_out():
    names = ["q", "k", "v", "g", "beta", "initial_state"]
    shapes = [[1, 2, 1, 4], [1, 2, 1, 4], [1, 2, 1, 4], [1, 2, 1, 4], [1, 2, 1], [1, 1, 4, 4]]
    inputs = [oh.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip(names, shapes, strict=True)]
    outputs = [oh.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("out", "final_state")]
    node = oh.make_node("KimiDeltaAttention", names, ["out", "final_state"], name="kda", domain="attnres",
                        scale=0.5, l2norm_eps=1e-6, plugin_version="1", plugin_namespace="attnres")
    model = oh.make_model(oh.make_graph([node], "g", inputs, outputs),
                          opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("attnres", 1)])
    result = preflight(model, REGISTRY, (10, 8), LIBS)
    assert not result.ok
    assert messages(result) == ("error: node 'kda': KimiDeltaAttention has no TensorRT plugin yet (docs/op-set.md); "
                                "build the portable form instead: attnres convert MODEL.onnx --target portable "
                                "-o MODEL.portable.onnx")


def test_function_shadowing_is_fatal_before_tensorrt_10_7():
    result = preflight(aggregate_model(with_function=True), REGISTRY, (10, 6), LIBS)
    assert not result.ok and "(< 10.7) inlines the function" in messages(result)


def test_function_shadowing_is_a_warning_from_tensorrt_10_7_when_the_node_has_a_namespace():
    result = preflight(aggregate_model(with_function=True), REGISTRY, (10, 7), LIBS)
    assert result.ok
    assert messages(result).startswith("warning:") and "prefers the registered plugin" in messages(result)


def test_function_shadowing_keys_on_op_type_alone_as_onnx_tensorrt_does():
    model = aggregate_model(with_function=True, function_domain="some.other.domain")
    result = preflight(model, REGISTRY, (10, 3), LIBS)
    assert not result.ok and "(< 10.7) inlines the function" in messages(result)


def test_function_shadowing_without_plugin_namespace_is_fatal_on_any_version():
    registry = [*REGISTRY, ("AttnResAggregate", "1", "")]
    result = preflight(aggregate_model(namespace=None, with_function=True), registry, (11, 1), LIBS)
    assert not result.ok and "no plugin_namespace" in messages(result)


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"source_type": TensorProto.DOUBLE}, "sources are double"),
    ({"weight_type": TensorProto.FLOAT16, "source_type": TensorProto.FLOAT16}, "score_weight is float16"),
    ({"second_source_type": TensorProto.FLOAT16}, "mixed types"),
])
def test_unsupported_input_dtypes_are_refused(kwargs, expected):
    result = preflight(aggregate_model(**kwargs), REGISTRY, (10, 8), LIBS)
    assert not result.ok and expected in messages(result)


@pytest.mark.parametrize("source_type", [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_supported_source_dtypes_pass(source_type):
    assert preflight(aggregate_model(source_type=source_type), REGISTRY, (10, 8), LIBS).ok


def test_ort_trt_domain_nodes_are_checked_too():
    result = preflight(aggregate_model(domain="trt.plugins", version="3"), REGISTRY, (10, 8), LIBS)
    assert not result.ok and "version mismatch" in messages(result)


def test_registry_listing_reads_v3_creators_from_tensorrt():
    creator = SimpleNamespace(name="AttnResAggregate", plugin_version="1", plugin_namespace="attnres")
    trt = SimpleNamespace(get_plugin_registry=lambda: SimpleNamespace(all_creators=[creator]))
    assert registry_listing(trt) == [("AttnResAggregate", "1", "attnres")]


def test_registry_listing_reads_all_creators_only_on_every_tensorrt_version(fake_trt, libraries):
    assert registry_listing(fake_trt) == []  # empty: no fallback to plugin_creator_list, gone in 11
    fake_trt.get_plugin_registry().load_library(str(libraries.trt_dyn))
    assert registry_listing(fake_trt) == ATTNRES_CREATORS


def attention_model(inputs: list[str]):
    from onnx import helper as oh

    values = [oh.make_tensor_value_info(n, TensorProto.FLOAT16, [1, 2, 3, 4]) for n in ("q", "k", "v")]
    values += [oh.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 3, 3]) for n in ("prev", "mask")]
    node = oh.make_node("ResidualScoreAttention", inputs, ["out", "scores"], domain="attnres", scale=0.5,
                        logit_divisor=1.0, plugin_version="1", plugin_namespace="attnres")
    graph = oh.make_graph([node], "g", [v for v in values if v.name in inputs],
                          [oh.make_tensor_value_info("out", TensorProto.FLOAT16, None)])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("attnres", 1)])


def test_empty_optional_input_is_refused_since_the_parser_passes_a_null_tensor():
    registry = [("ResidualScoreAttention", "1", "attnres")]
    assert preflight(attention_model(["q", "k", "v", "prev", "mask"]), registry, (10, 8), LIBS).ok
    result = preflight(attention_model(["q", "k", "v", "", "mask"]), registry, (10, 8), LIBS)
    assert not result.ok
    assert "null tensor" in messages(result) and "attnres convert --target tensorrt" in messages(result)


def aggregate_norm_model(norm_type: int, source_type: int = TensorProto.FLOAT16) -> onnx.ModelProto:
    """One compact-spelled AttnResAggregateNorm node over two ``[4, 8]`` sources."""
    node = oh.make_node("AttnResAggregateNorm", ["sw", "nw", "x0", "x1"], ["y"], name="aggn0", domain="attnres",
                        eps=1e-6, norm_eps=1e-5, has_aggregate=0, plugin_version="1", plugin_namespace="attnres")
    inputs = [oh.make_tensor_value_info("sw", TensorProto.FLOAT, [8]), oh.make_tensor_value_info("nw", norm_type, [8]),
              oh.make_tensor_value_info("x0", source_type, [4, 8]),
              oh.make_tensor_value_info("x1", source_type, [4, 8])]
    graph = oh.make_graph([node], "g", inputs, [oh.make_tensor_value_info("y", source_type, [4, 8])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("attnres", 1)])


def test_aggregate_norm_takes_a_float32_norm_weight_beside_storage_typed_sources():
    assert preflight(aggregate_norm_model(TensorProto.FLOAT), ATTNRES_CREATORS, (10, 8), LIBS).ok
    result = preflight(aggregate_norm_model(TensorProto.FLOAT16), ATTNRES_CREATORS, (10, 8), LIBS)
    assert not result.ok and "norm_weight is float16; the plugin takes float32" in messages(result)


def test_onnx_runtime_s_own_ops_of_the_onnxruntime_target_are_refused_with_the_tensorrt_way_out():
    model = aggregate_model()
    model.graph.node.append(onnx.helper.make_node("GroupQueryAttention", [], [], name="gqa", domain="com.microsoft"))
    model.graph.node.append(onnx.helper.make_node("SimplifiedLayerNormalization", [], [], name="norm"))
    model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    result = preflight(model, REGISTRY, (10, 8), LIBS)
    assert not result.ok
    text = messages(result)
    assert "'gqa': GroupQueryAttention is one of ONNX Runtime's own ops" in text and "'norm'" in text
    assert "--target tensorrt" in text
