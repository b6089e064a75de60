"""Every op descriptor is complete and consistent: its schema, its plugin's YAML, its NumPy reference, its
portable decomposition and its two spellings agree. A new op without an example here fails the first test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.graphs.schemas import public_schema
from attnres_export.graphs.targets import convert
from attnres_export.ops.descriptors import OPS, PLUGIN_ATTRIBUTES
from attnres_export.ops.onnx_nodes import attribute

PLUGINS = Path(__file__).resolve().parents[2] / "attnres_export" / "plugins"

EXAMPLES = {
    "AttnResAggregate": {
        "inputs": {"score_weight": [1000], "sources": [[1, 3, 1000], [1, 3, 1000], [1, 3, 1000]]},
        "attributes": {"eps": 1e-6},
    },
    "AttnResAggregateNorm": {
        "inputs": {"score_weight": [1000], "norm_weight": [1000],
                   "sources": [[1, 3, 1000], [1, 3, 1000], [1, 3, 1000]]},
        "attributes": {"eps": 1e-6, "norm_eps": 1e-5},
    },
    "ResidualScoreAttention": {
        "inputs": {"q": [2, 3, 5, 8], "k": [2, 3, 7, 8], "v": [2, 3, 7, 6], "prev_scores": [2, 3, 5, 7],
                   "mask_bias": [2, 1, 1, 7]},
        "attributes": {"scale": 0.35, "logit_divisor": 2.0},
    },
    "KimiDeltaAttention": {
        "inputs": {"q": [2, 5, 3, 8], "k": [2, 5, 3, 8], "v": [2, 5, 3, 6], "g": [2, 5, 3, 8], "beta": [2, 5, 3],
                   "initial_state": [2, 3, 8, 6]},
        "attributes": {"scale": 0.35, "l2norm_eps": 1e-6},
    },
}
"""Per op: the shape of each input (a list of shapes for a variadic one) and attribute values."""


def single_node_model(op_type: str, storage: int, drop: str | None = None) -> tuple[onnx.ModelProto, dict]:
    """One node of ``op_type`` fed by graph inputs of the example shapes (``drop``: an optional input left out)."""
    op, example = OPS[op_type], EXAMPLES[op_type]
    rng = np.random.default_rng(7)
    names, values, feeds = [], [], {}
    for spec in op.inputs:
        shapes = example["inputs"][spec.name]
        for i, shape in enumerate(shapes if spec.kind == "variadic" else [shapes]):
            name = f"{spec.name}{i}" if spec.kind == "variadic" else spec.name
            if spec.name == drop:
                names.append("")
                continue
            elem = storage if spec.storage else TensorProto.FLOAT
            array = rng.standard_normal(shape).astype(oh.tensor_dtype_to_np_dtype(elem))
            names.append(name)
            values.append(oh.make_tensor_value_info(name, elem, shape))
            feeds[name] = array
    outputs = [oh.make_tensor_value_info(o.name, storage if o.storage else TensorProto.FLOAT, None)
               for o in op.outputs]
    node = oh.make_node(op_type, names, [o.name for o in op.outputs], name="n", domain="attnres",
                        **example["attributes"], **PLUGIN_ATTRIBUTES)
    graph = oh.make_graph([node], "g", values, outputs)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("attnres", 1)]), feeds


def test_every_op_has_an_example_here() -> None:
    assert set(EXAMPLES) == set(OPS)


@pytest.mark.parametrize("op_type", sorted(OPS))
def test_schema_lists_the_descriptors_inputs_outputs_and_attributes(op_type: str) -> None:
    op, schema = OPS[op_type], public_schema(OPS[op_type])
    assert [i.name for i in schema.inputs] == [i.name for i in op.inputs]
    assert [o.name for o in schema.outputs] == [o.name for o in op.outputs]
    assert set(schema.attributes) == {*op.plugin_fields, *PLUGIN_ATTRIBUTES}


@pytest.mark.parametrize("op_type", sorted(t for t, op in OPS.items() if op.has_plugin))
def test_plugin_fields_are_the_plugin_configs_attributes(op_type: str) -> None:
    config = yaml.safe_load(next(PLUGINS.glob(f"*/{op_type}_PluginConfig.yaml")).read_text())
    assert config["name"] == op_type
    assert list(config["versions"]["1"]["attributes"]) == list(OPS[op_type].plugin_fields)


@pytest.mark.parametrize("op_type", sorted(OPS))
def test_an_op_has_a_plugin_folder_exactly_when_its_descriptor_says_so(op_type: str) -> None:
    folders = list(PLUGINS.glob(f"*/{op_type}_PluginConfig.yaml"))
    assert len(folders) == int(OPS[op_type].has_plugin)


@pytest.mark.parametrize("storage", [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16])
@pytest.mark.parametrize("op_type", sorted(OPS))
def test_reference_op_and_portable_decomposition_agree(op_type: str, storage: int) -> None:
    model, feeds = single_node_model(op_type, storage)
    if storage == TensorProto.BFLOAT16:
        feeds = {k: v.astype(np.float32) if v.dtype.name == "bfloat16" else v for k, v in feeds.items()}
    with OnnxRuntimeRunner(model) as fused, OnnxRuntimeRunner(convert(model, "portable")) as portable:
        want, got = fused.infer(feeds), portable.infer(feeds)
    bar = 1e-5 if storage == TensorProto.FLOAT else 1e-2
    for name, value in want.items():
        np.testing.assert_allclose(got[name].astype(np.float64), value.astype(np.float64), rtol=bar, atol=bar)


@pytest.mark.parametrize("op_type", sorted(OPS))
def test_compact_and_onnx_spellings_round_trip_for_every_absent_optional_input(op_type: str) -> None:
    op = OPS[op_type]
    for drop in [None, *(i.name for i in op.inputs if i.kind == "optional")]:
        model, _ = single_node_model(op_type, TensorProto.FLOAT, drop)
        node = model.graph.node[0]
        canonical = op.canonical_inputs(node)
        op.compact(node)
        assert "" not in node.input and op.canonical_inputs(node) == canonical
        assert not op.node_problems(node)
        op.expand(node)
        assert op.canonical_inputs(node) == canonical and not op.is_compact(node)


@pytest.mark.parametrize("op_type", sorted(OPS))
def test_compact_and_onnx_spellings_round_trip_with_and_without_each_optional_output(op_type: str) -> None:
    op = OPS[op_type]
    optional = [i for i, spec in enumerate(op.outputs) if spec.presence_attribute]
    for dropped in [None, *optional]:
        model, _ = single_node_model(op_type, TensorProto.FLOAT)
        node = model.graph.node[0]
        if dropped is not None:
            node.output[dropped] = ""
        listed = op.listed_outputs(node)
        op.compact(node)
        assert "" not in node.output and op.listed_outputs(node) == listed
        assert not op.node_problems(node)
        for position in optional:
            assert attribute(node, op.outputs[position].presence_attribute) == int(position != dropped)
        op.expand(node)
        assert op.listed_outputs(node) == listed and not op.is_compact(node)
        assert "" not in node.output
