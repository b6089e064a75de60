"""``build_engine`` and ``attnres build`` run their real code against the strict TensorRT fake of each version:
profiles, options, the embedded plugin and its check in a fresh process, stale timing caches, the inspector."""

from __future__ import annotations

import json
import subprocess

import onnx
import pytest
from typer.testing import CliRunner

from attnres_export.backends.tensorrt.builder import BuildOptions, build_engine
from attnres_export.backends.tensorrt.manifest import read_manifest, sha256_file
from attnres_export.backends.tensorrt.verify_embedded import NOT_EMBEDDED
from attnres_export.cli import app
from attnres_export.dims import DimRange
from attnres_export.errors import EngineError
from attnres_export.spawn import python_main
from tests.backends.tensorrt.graphs import aggregate_model, past_model


def attnres_node_names(path) -> list[str]:
    """The names of an ONNX file's attnres nodes, in graph order (what the manifest must list as plugins)."""
    return [node.name for node in onnx.load(str(path), load_external_data=False).graph.node if node.domain == "attnres"]


def payload(trt, engine) -> dict:
    return trt._engine_payload(engine.read_bytes())


def test_build_writes_a_strongly_typed_engine_and_a_manifest_with_every_aggregation_as_plugin(
        fake_trt, libraries, exported_onnx, tmp_path):
    out = tmp_path / "m.engine"
    result = build_engine(BuildOptions(exported_onnx, out, plugin=libraries.trt))
    engine = payload(fake_trt, out)
    assert engine["strongly_typed"] and engine["tensorrt"] == fake_trt.__version__
    assert engine["profiles"] == [{"input_ids": [[1, 1], [2, 16], [4, 64]]}]
    manifest = read_manifest(out)
    assert manifest == result.manifest and manifest.dtype == "float16"
    assert manifest.plugin_nodes == attnres_node_names(exported_onnx) and len(manifest.plugin_nodes) == 5
    assert manifest.inlined_nodes == [] and manifest.unknown_nodes == []
    assert not manifest.plugin_embedded and not manifest.version_compatible
    assert manifest.plugin_sha256 == sha256_file(libraries.trt) and result.notes == []


def test_requested_ranges_opt_level_and_workspace_reach_the_engine(fake_trt, libraries, exported_onnx, tmp_path):
    out = tmp_path / "m.engine"
    build_engine(BuildOptions(exported_onnx, out, plugin=libraries.trt, batch=DimRange(1, 1, 2),
                              seq=DimRange(4, 8, 32), opt_level=5, workspace_mb=64))
    engine = payload(fake_trt, out)
    assert engine["opt_level"] == 5 and engine["pools"] == {"WORKSPACE": 64 << 20}
    runtime = fake_trt.Runtime(fake_trt.Logger())
    shapes = runtime.deserialize_cuda_engine(out.read_bytes()).get_tensor_profile_shape("input_ids", 0)
    assert shapes == [(1, 4), (1, 8), (2, 32)]


def test_embed_plugin_serializes_the_dyn_library_into_a_version_compatible_engine_checked_in_a_fresh_process(
        fake_trt, libraries, exported_onnx, tmp_path):
    out = tmp_path / "m.engine"
    result = build_engine(BuildOptions(exported_onnx, out, plugin=libraries.trt_dyn, embed_plugin=True))
    engine = payload(fake_trt, out)
    assert "VERSION_COMPATIBLE" in engine["flags"]
    assert [lib["path"] for lib in engine["embedded"]] == [str(libraries.trt_dyn)]
    assert result.manifest.plugin_embedded and result.manifest.version_compatible and result.notes == []
    assert result.manifest.plugin_nodes == attnres_node_names(exported_onnx)


def test_an_embedding_a_fresh_process_cannot_load_is_recorded_as_not_embedded_in_one_line(
        fake_trt, libraries, tmp_path):
    model = tmp_path / "vendor.onnx"
    onnx.save(aggregate_model(vendor_plugin=True), str(model))
    vendor = tmp_path / "libvendor.so"
    vendor.write_text(fake_trt._plugin_library([("VendorScale", "1", "vendor")], dynamic=False))
    fake_trt._dlopen(vendor)  # the user's other plugin, loaded in this process only: it is not embedded
    result = build_engine(BuildOptions(model, tmp_path / "m.engine", plugin=libraries.trt_dyn, embed_plugin=True))
    assert not result.manifest.plugin_embedded and result.manifest.version_compatible
    (note,) = result.notes
    assert note.startswith("warning: m.engine does not carry its plugin (") and "\n" not in note
    assert f"runners load {libraries.trt_dyn}" in note


def test_the_fresh_process_check_fails_in_one_line_for_an_engine_without_its_plugin(
        fake_trt, libraries, exported_onnx, tmp_path):
    out = tmp_path / "m.engine"
    build_engine(BuildOptions(exported_onnx, out, plugin=libraries.trt))
    proc = subprocess.run(python_main("attnres_export.backends.tensorrt.verify_embedded", str(out)),
                          capture_output=True, text=True, check=False)
    assert proc.returncode == NOT_EMBEDDED
    assert proc.stderr.strip().splitlines() == [
        f"TensorRT {fake_trt.__version__} could not deserialize it in a fresh process that loads no plugin library, "
        "with engine host code allowed"]


def test_timing_cache_is_written_and_reused_without_warnings(fake_trt, libraries, exported_onnx, tmp_path):
    cache = tmp_path / "trt.cache"
    for _ in range(2):
        result = build_engine(BuildOptions(exported_onnx, tmp_path / "m.engine", plugin=libraries.trt,
                                           timing_cache=cache))
        assert result.notes == []
    data = json.loads(cache.read_bytes().split(b"\n", 1)[1])
    assert data["tensorrt"] == fake_trt.__version__ and data["entries"] > 0


@pytest.mark.parametrize("stale", ["another GPU", "another TensorRT", "not a cache"])
def test_a_stale_timing_cache_warns_in_one_line_and_is_replaced_after_the_engine_is_written(
        fake_trt, libraries, exported_onnx, tmp_path, stale):
    cache = tmp_path / "trt.cache"
    cache.write_bytes({"another GPU": fake_trt._timing_cache_blob(fake_trt.__version__, "Other GPU", 7),
                       "another TensorRT": fake_trt._timing_cache_blob("9.0.0", fake_trt._DEVICE, 7),
                       "not a cache": b"\x00garbage"}[stale])
    out = tmp_path / "m.engine"
    result = build_engine(BuildOptions(exported_onnx, out, plugin=libraries.trt, timing_cache=cache))
    assert out.is_file() and payload(fake_trt, out)["timing_cache"]
    (note,) = result.notes
    assert note.startswith(f"warning: TensorRT refused the timing cache {cache}") and "fresh one" in note
    fresh = json.loads(cache.read_bytes().split(b"\n", 1)[1])
    assert (fresh["tensorrt"], fresh["device"]) == (fake_trt.__version__, fake_trt._DEVICE)


@pytest.mark.parametrize(("style", "as_plugin"), [("PluginType", True), ("Myelin", False)])
def test_inspector_plugin_type_keys_count_as_plugin_and_myelin_foreign_nodes_as_unknown(
        fake_trt, libraries, exported_onnx, tmp_path, monkeypatch, style, as_plugin):
    monkeypatch.setattr(fake_trt, "_inspector_style", style)
    manifest = build_engine(BuildOptions(exported_onnx, tmp_path / "m.engine", plugin=libraries.trt)).manifest
    names = attnres_node_names(exported_onnx)
    expected = (names, [], []) if as_plugin else ([], [], names)
    assert (manifest.plugin_nodes, manifest.inlined_nodes, manifest.unknown_nodes) == expected


def test_a_plugin_missing_from_the_registry_fails_parsing_with_the_parsers_first_error(
        fake_trt, libraries, tmp_path):
    model = tmp_path / "vendor.onnx"
    onnx.save(aggregate_model(vendor_plugin=True), str(model))
    with pytest.raises(EngineError, match=r"could not parse .*VendorScale.*Plugin not found"):
        build_engine(BuildOptions(model, tmp_path / "m.engine", plugin=libraries.trt))


def test_cli_build_with_embed_plugin_reports_the_plugin_embedded(fake_trt, libraries, exported_onnx, tmp_path):
    out = tmp_path / "m.engine"
    result = CliRunner().invoke(app, ["build", str(exported_onnx), "-o", str(out), "--plugin",
                                      str(libraries.trt_dyn), "--embed-plugin"])
    assert result.exit_code == 0, result.output
    assert "plugin embedded" in result.output and f"as plugin: {attnres_node_names(exported_onnx)[0]}," in result.output


@pytest.mark.slow
def test_a_fused_norm_export_builds_with_every_aggregate_norm_node_as_plugin(fake_trt, libraries, block2_checkpoint,
                                                                             tmp_path):
    from attnres_export.exporter.checkpoint import export_checkpoint
    from attnres_export.exporter.options import ExportOptions

    onnx_path = tmp_path / "n.onnx"
    export_checkpoint(ExportOptions(block2_checkpoint, onnx_path, dtype="float16", batch=DimRange(1, 2, 4),
                                    seq=DimRange(1, 16, 64), check=False, fuse_norm=True))
    manifest = build_engine(BuildOptions(onnx_path, tmp_path / "n.engine", plugin=libraries.trt)).manifest
    assert manifest.plugin_nodes == attnres_node_names(onnx_path) and len(manifest.plugin_nodes) == 5
    assert manifest.inlined_nodes == [] and manifest.unknown_nodes == []


def test_cli_build_past_narrows_the_past_inputs_and_the_mask_together(fake_trt, libraries, tmp_path):
    model = tmp_path / "past.onnx"
    onnx.save(past_model(), str(model))
    out = tmp_path / "past.engine"
    result = CliRunner().invoke(app, ["build", str(model), "-o", str(out), "--plugin", str(libraries.trt),
                                      "--past", "0:3:6", "--seq", "1:1:2"])
    assert result.exit_code == 0, result.output
    profile = payload(fake_trt, out)["profiles"][0]
    assert profile["past_key_values.0.key"] == [[1, 2, 0, 4], [1, 2, 3, 4], [4, 2, 6, 4]]
    assert profile["attention_mask"] == [[1, 1], [1, 4], [4, 8]]
    assert read_manifest(out).dims == {"batch": [1, 1, 4], "seq": [1, 1, 2], "past": [0, 3, 6], "total": [1, 4, 8]}


@pytest.mark.parametrize(("past", "message"), [
    ("-1:2:4", "--past '-1:2:4': need 0 <= MIN <= OPT <= MAX"),
    ("0:8:20", "--past 0:8:20 is outside the exported past range 0:8:15"),
])
def test_cli_build_refuses_a_bad_past_range_in_one_line(fake_trt, libraries, tmp_path, past, message):
    model = tmp_path / "past.onnx"
    onnx.save(past_model(), str(model))
    result = CliRunner().invoke(app, ["build", str(model), "--plugin", str(libraries.trt), "--past", past])
    assert result.exit_code == 1
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert message in line
