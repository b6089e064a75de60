"""The ort-trt target: fused nodes in domain trt.plugins, written as ONNX Runtime's TensorRT execution provider and
TensorRT's ONNX parser pass a node to an IPluginV3 creator (docs/tensorrt.md), and still runnable on the CPU.

The path, read in the sources (not run: no GPU here): ONNX Runtime (from 1.22, microsoft/onnxruntime#24211) lists
every creator of TensorRT's registry (``getAllCreators``) as an op of domain ``trt.plugins`` with variadic inputs and
outputs of any type and unchecked attributes, and copies the node, attributes and domain unchanged into the model it
hands to onnx-tensorrt. There ``FallbackPluginImporter`` looks the creator up by (op type, ``plugin_version``,
``plugin_namespace``) and ``loadFields`` passes, for each field the creator's ``getFieldNames`` lists, the attribute
of that name: FLOAT as one kFLOAT32, INT as one kINT32 (narrowed from int64), STRING as kCHAR. The creators' field
lists are read here from their C++ sources, so the check does not lean on the Python descriptors that wrote the file.
"""

from __future__ import annotations

import re

import onnx
import pytest
from onnx import AttributeProto

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeCudaRunner, OnnxRuntimeRunner, cuda_provider_available
from attnres_export.dims import DimRange
from attnres_export.errors import ParityError
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.graphs.targets import convert
from attnres_export.models import save_checkpoint
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example
from attnres_export.models.realformer import RealFormerConfig
from attnres_export.ops.onnx_nodes import attribute
from attnres_export.plugins.build import SOURCE_DIR
from tests.conftest import slow_after

LOAD_FIELDS = {AttributeProto.FLOAT: "kFLOAT32", AttributeProto.INT: "kINT32", AttributeProto.STRING: "kCHAR"}
"""onnx-tensorrt ``loadFields`` (onnxOpImporters.cpp at release/10.1-GA 96e78110 and at dd0a3a9f): the
PluginFieldType each single-valued attribute type becomes."""

ORT_CUSTOM_DOMAIN_VERSIONS = range(1, 1001)
"""Opset versions ONNX Runtime registers a custom-op domain for (session/custom_ops.cc, RegisterOpSet(.., 1, 1000))."""


def creators() -> dict[str, dict]:
    """Per plugin name, as its C++ source declares it: version, namespace and the fields of getFieldNames."""
    namespace = re.search(r'kPLUGIN_NAMESPACE\{"([^"]*)"\}', (SOURCE_DIR / "common" / "attnresPluginCommon.h")
                          .read_text()).group(1)
    found = {}
    for header in SOURCE_DIR.glob("*Plugin/*Plugin.h"):
        text = header.read_text()
        name = re.search(r'constexpr char const\* k\w+_NAME\{"([^"]+)"\}', text).group(1)
        version = re.search(r'constexpr char const\* k\w+_VERSION\{"([^"]+)"\}', text).group(1)
        source = header.with_suffix(".cpp").read_text()
        constants = dict(re.findall(r'constexpr char const\* (k\w+_FIELD)\{"([^"]+)"\}', source))
        fields = {constants[key]: kind for key, kind in
                  re.findall(r"mFields\.emplace_back\((k\w+_FIELD), nullptr, PluginFieldType::(k\w+), 1\)", source)}
        found[name] = {"version": version, "namespace": namespace, "fields": fields}
    return found


EXPORTS = {
    "fused-norm": (AttnResLMConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_seq_len=16,
                                   block_size=2), {"dtype": "float16", "fuse_norm": True}),
    "realformer": (RealFormerConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_seq_len=16,
                                    running_mean=True), {}),
}
"""Exports with the other two ops: AttnResAggregateNorm (--fuse-norm, float16) and ResidualScoreAttention
(RealFormer: padding mask, residual scores from layer 1 on)."""
MODELS = slow_after(["aggregate", *EXPORTS])
"""AttnResAggregate (the session's tiny model) in the fast loop; the exports of the other ops (seconds each) in the
full run."""


@pytest.fixture(scope="module")
def ort_trt_models(artifacts, tmp_path_factory):
    """``name -> the ort-trt form of that export``, each exported on first use."""
    root = tmp_path_factory.mktemp("ort-trt")
    made = {"aggregate": convert(onnx.load(str(artifacts.tensorrt)), "ort-trt")}

    def get(name: str) -> onnx.ModelProto:
        if name not in made:
            cfg, options = EXPORTS[name]
            checkpoint = root / f"{name}.pt"
            save_checkpoint(make_example(cfg, seed=5), cfg, checkpoint)
            out = root / f"{name}.tensorrt.onnx"
            export_checkpoint(ExportOptions(checkpoint, out, batch=DimRange(1, 1, 2), seq=DimRange(1, 4, 8),
                                            check=False, **options))
            made[name] = convert(onnx.load(str(out)), "ort-trt")
        return made[name]

    return get


def plugin_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == "trt.plugins"]


def test_ort_trt_moves_every_fused_node_to_trt_plugins_keeping_attributes(artifacts):
    source = onnx.load(str(artifacts.tensorrt))
    converted = onnx.load(str(artifacts.ort_trt))
    fused = [n for n in source.graph.node if n.domain == "attnres"]
    moved = plugin_nodes(converted)
    assert fused and len(moved) == len(fused)
    assert not [n for n in converted.graph.node if n.domain == "attnres"]
    for before, after in zip(fused, moved, strict=True):
        assert after.op_type == before.op_type and list(after.input) == list(before.input)
        for name in ("eps", "plugin_version", "plugin_namespace"):
            assert attribute(after, name) == attribute(before, name)
    imports = {e.domain: e.version for e in converted.opset_import}
    assert imports.get("trt.plugins") in ORT_CUSTOM_DOMAIN_VERSIONS and "attnres" not in imports


@pytest.mark.parametrize("name", MODELS)
def test_every_plugin_node_reaches_its_creator_with_each_declared_field_in_its_declared_type(ort_trt_models, name):
    declared = creators()
    nodes = plugin_nodes(ort_trt_models(name))
    assert nodes
    for node in nodes:
        creator = declared[node.op_type]
        attrs = {a.name: a for a in node.attribute}
        assert attribute(node, "plugin_version") == creator["version"].encode()
        assert attribute(node, "plugin_namespace") == creator["namespace"].encode()
        assert all(a.type in LOAD_FIELDS for a in node.attribute), "an attribute loadFields cannot pass"
        for field, kind in creator["fields"].items():
            assert field in attrs, f"{node.name}: no attribute for field {field}; the creator would miss it"
            assert LOAD_FIELDS[attrs[field].type] == kind, f"{node.name}: {field} would arrive as the wrong type"
            if kind == "kINT32":
                assert -2**31 <= attrs[field].i < 2**31
        assert all(node.input), f"{node.name}: an empty input name becomes a null plugin input"


@pytest.mark.slow
def test_the_three_ops_and_their_flags_are_covered(ort_trt_models):
    models = [ort_trt_models(name) for name in ("aggregate", *EXPORTS)]
    seen = {(n.op_type, a.name) for m in models for n in plugin_nodes(m) for a in n.attribute}
    assert {("AttnResAggregate", "eps"), ("AttnResAggregateNorm", "has_aggregate"),
            ("ResidualScoreAttention", "has_prev_scores"), ("ResidualScoreAttention", "has_mask")} <= seen


@pytest.mark.parametrize("name", MODELS)
def test_every_plugin_node_output_has_a_stated_element_type(ort_trt_models, name):
    model = ort_trt_models(name)
    stated = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.value_info, *model.graph.output)}
    for node in plugin_nodes(model):
        for output in filter(None, node.output):
            assert stated.get(output), f"{node.name}: output {output} has no type; ONNX Runtime cannot infer it"


def test_converting_states_the_types_of_fused_outputs_the_source_leaves_untyped(artifacts):
    source = onnx.load(str(artifacts.tensorrt))
    fused_outputs = {o for n in source.graph.node if n.domain == "attnres" for o in n.output}
    exported = {v.name: v.type.tensor_type.elem_type for v in source.graph.value_info if v.name in fused_outputs}
    assert exported and set(exported) == fused_outputs  # the exporter's own types, from torch
    kept = [v for v in source.graph.value_info if v.name not in fused_outputs]
    del source.graph.value_info[:]
    source.graph.value_info.extend(kept)
    converted = convert(source, "ort-trt")
    stated = {v.name: v.type.tensor_type.elem_type for v in converted.graph.value_info}
    assert {name: stated.get(name) for name in exported} == exported


def test_ort_trt_onnx_runs_on_cpu_with_the_reference_ops(artifacts):
    import numpy as np

    runner = OnnxRuntimeRunner(artifacts.ort_trt)
    with runner:
        out = runner.infer({"input_ids": np.zeros((1, 3), dtype=np.int64)})
    assert runner.backend == "onnxruntime+ref-ops" and out["logits"].shape == (1, 3, 32)


@pytest.mark.skipif(cuda_provider_available(), reason="this machine has onnxruntime-gpu's CUDA provider")
def test_cuda_runner_without_onnxruntime_gpu_is_a_clear_parity_error(artifacts):
    with pytest.raises(ParityError, match="install onnxruntime-gpu"):
        OnnxRuntimeCudaRunner(artifacts.tensorrt)


def test_the_creator_sources_declare_fields_for_every_op():
    declared = creators()
    assert set(declared) == {"AttnResAggregate", "AttnResAggregateNorm", "ResidualScoreAttention"}
    assert declared["AttnResAggregate"]["fields"] == {"eps": "kFLOAT32"}
    assert all(c["fields"] for c in declared.values())
