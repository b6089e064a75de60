"""The build path up to TensorRT: missing TensorRT, plugin resolution, layer classification, engine loading."""

from __future__ import annotations

import sys

import onnx
import pytest
from typer.testing import CliRunner

from attnres_export.backends.tensorrt import plugin_library
from attnres_export.backends.tensorrt.builder import classify_layers
from attnres_export.backends.tensorrt.manifest import write_manifest
from attnres_export.backends.tensorrt.runner import TensorRTRunner
from attnres_export.cli import app
from attnres_export.errors import EngineError
from tests.backends.tensorrt.graphs import token_model
from tests.backends.tensorrt.test_manifest import manifest

INSPECTOR_JSON = {"Layers": [
    {"Name": "embed", "LayerType": "Gather"},
    {"Name": "agg0", "LayerType": "PluginV3"},
    {"Name": "agg1 + add", "LayerType": "PluginV3"},
    {"Name": "agg2_decomposed/ReduceSumSquare", "LayerType": "Reduce"},
]}


@pytest.fixture
def no_tensorrt(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)


@pytest.fixture
def token_onnx(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(token_model(), str(path))
    return path


def test_build_without_tensorrt_exits_1_with_one_line_naming_the_fix(no_tensorrt, token_onnx):
    result = CliRunner().invoke(app, ["build", str(token_onnx)])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "TensorRT is not installed" in lines[0] and "pip install tensorrt" in lines[0]


def test_build_refuses_a_range_outside_the_export_before_needing_tensorrt(no_tensorrt, token_onnx):
    result = CliRunner().invoke(app, ["build", str(token_onnx), "--seq", "1:16:4096"])
    assert result.exit_code == 1 and "outside the exported seq range 1:16:64" in result.output


def test_inspector_layers_split_nodes_into_plugin_and_inlined():
    as_plugin, inlined, unknown = classify_layers(INSPECTOR_JSON, ["agg0", "agg1", "agg2"])
    assert as_plugin == ["agg0", "agg1"] and inlined == ["agg2"] and unknown == []


def test_a_layer_with_a_plugin_type_key_is_a_plugin_layer_whatever_its_layer_type():
    info = {"Layers": [{"Name": "agg0", "LayerType": "Plugin", "PluginType": "AttnResAggregate"}]}
    assert classify_layers(info, ["agg0"]) == (["agg0"], [], [])


def test_nodes_possibly_inside_a_myelin_foreign_node_are_unknown_not_inlined():
    info = {"Layers": [{"Name": "agg0", "LayerType": "PluginV3"}, {"Name": "add_1", "LayerType": "ElementWise"},
                       {"Name": "{ForeignNode[embed...agg3]}", "LayerType": "Myelin"}]}
    assert classify_layers(info, ["agg0", "add_1", "agg2"]) == (["agg0"], ["add_1"], ["agg2"])


def test_embed_plugin_needs_the_dyn_library(tmp_path):
    static = tmp_path / "libattnres_trt.so"
    static.write_bytes(b"")
    with pytest.raises(EngineError, match=r"needs libattnres_trt_dyn\.so"):
        plugin_library.resolve(static, dynamic=True)
    with pytest.raises(EngineError, match="does not exist"):
        plugin_library.resolve(tmp_path / "missing.so")


def test_no_built_plugin_says_how_to_build_one(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNRES_PLUGIN_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(EngineError, match="attnres plugin build"):
        plugin_library.resolve(None)


def test_loading_an_engine_whose_plugin_is_gone_names_the_library_from_the_manifest(tmp_path):
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"not really an engine")
    write_manifest(engine, manifest(library="/gone/libattnres_trt.so"))
    with pytest.raises(EngineError, match=r"needs the plugin library /gone/libattnres_trt\.so"):
        TensorRTRunner(engine).activate()


def test_an_embedded_plugin_needs_no_library_file_only_when_host_code_is_allowed(tmp_path):
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"")
    write_manifest(engine, manifest(library="/gone/libattnres_trt_dyn.so", embedded=True))
    assert TensorRTRunner(engine, allow_engine_host_code=True).plugin_to_load() is None
    with pytest.raises(EngineError, match="--allow-engine-host-code"):
        TensorRTRunner(engine).plugin_to_load()


def test_running_an_engine_without_tensorrt_names_the_fix(no_tensorrt, tmp_path):
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"")
    write_manifest(engine, manifest(library=None))
    with pytest.raises(EngineError, match="pip install tensorrt"):
        TensorRTRunner(engine).activate()
