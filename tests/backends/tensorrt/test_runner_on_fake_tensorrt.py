"""The TensorRT runner and the check/bench commands against the strict fake: which plugin library is trusted,
when engine host code runs, and engines without a manifest (built by trtexec or Polygraphy).

Deserializing needs no GPU on the fake; ``pretend_gpu`` gets the runner past its check that torch sees one.
"""

from __future__ import annotations

import dataclasses

import onnx
import pytest
from onnx import TensorProto
from typer.testing import CliRunner

from attnres_export.backends.factory import engine_runner
from attnres_export.backends.tensorrt import plugin_library
from attnres_export.backends.tensorrt.builder import BuildOptions, build_engine
from attnres_export.backends.tensorrt.manifest import manifest_path, read_manifest, write_manifest
from attnres_export.backends.tensorrt.runner import TensorRTRunner
from attnres_export.cli import app
from attnres_export.errors import EngineError
from tests.backends.tensorrt.graphs import aggregate_model, past_model


def pretend_gpu(monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def as_in_a_new_process(trt, monkeypatch) -> None:
    """Forget every plugin this process registered or loaded, as a process that did not build the engine."""
    trt.get_plugin_registry()._creators.clear()
    monkeypatch.setattr(plugin_library, "_loaded", {}, raising=False)


def registered(trt) -> list[tuple[str, str, str]]:
    return [(c.name, c.plugin_version, c.plugin_namespace) for c in trt.get_plugin_registry().all_creators]


@pytest.fixture
def engine(fake_trt, libraries, exported_onnx, tmp_path, monkeypatch):
    """An engine whose manifest names the static library, run as by a process that did not build it."""
    out = tmp_path / "m.engine"
    build_engine(BuildOptions(exported_onnx, out, plugin=libraries.trt))
    as_in_a_new_process(fake_trt, monkeypatch)
    return out


@pytest.fixture
def embedded_engine(fake_trt, libraries, exported_onnx, tmp_path, monkeypatch):
    """An engine built with --embed-plugin (the _dyn library), run as by a process that did not build it."""
    out = tmp_path / "embedded.engine"
    assert build_engine(BuildOptions(exported_onnx, out, plugin=libraries.trt_dyn, embed_plugin=True)
                        ).manifest.plugin_embedded
    as_in_a_new_process(fake_trt, monkeypatch)
    return out


def test_the_manifests_library_is_loaded_when_its_sha256_matches(fake_trt, engine, monkeypatch):
    pretend_gpu(monkeypatch)
    runner = TensorRTRunner(engine)
    runner.load()
    assert runner.engine is not None and not runner.runtime.engine_host_code_allowed
    assert ("AttnResAggregate", "1", "attnres") in registered(fake_trt)
    assert runner.io_names(True) == ["input_ids"] and runner.input_axes() == {"input_ids": ["batch", "seq"]}


def test_a_library_changed_since_the_build_is_refused_in_one_line(fake_trt, libraries, engine, monkeypatch):
    pretend_gpu(monkeypatch)
    libraries.trt.write_text(libraries.trt.read_text() + " ")
    with pytest.raises(EngineError, match=r"is not the plugin library m\.engine was built with .* --plugin") as err:
        TensorRTRunner(engine).load()
    assert "\n" not in str(err.value) and registered(fake_trt) == []


def test_an_explicit_plugin_is_trusted_without_the_manifests_sha256(fake_trt, libraries, engine, monkeypatch):
    pretend_gpu(monkeypatch)
    libraries.trt.write_text(libraries.trt.read_text() + " ")
    runner = TensorRTRunner(engine, plugin=libraries.trt)
    runner.load()
    assert runner.engine is not None


def test_host_code_stays_off_when_the_manifest_says_embedded_and_the_user_did_not_allow_it(
        fake_trt, libraries, embedded_engine, monkeypatch):
    pretend_gpu(monkeypatch)
    runner = TensorRTRunner(embedded_engine)
    assert runner.plugin_to_load() == libraries.trt_dyn
    with pytest.raises(EngineError, match="--allow-engine-host-code: pass it if you built or trust the engine"):
        runner.load()
    assert not runner.runtime.engine_host_code_allowed
    assert ("AttnResAggregate", "1", "attnres") in registered(fake_trt)  # the _dyn fallback was loaded


def test_allowed_host_code_runs_the_embedded_plugin_without_loading_any_library(
        fake_trt, embedded_engine, monkeypatch):
    pretend_gpu(monkeypatch)
    runner = TensorRTRunner(embedded_engine, allow_engine_host_code=True)
    assert runner.plugin_to_load() is None
    runner.load()
    assert runner.engine is not None and runner.runtime.engine_host_code_allowed and registered(fake_trt) == []


def test_a_manifest_edited_to_say_embedded_neither_skips_the_sha256_check_nor_allows_host_code(
        fake_trt, libraries, engine, monkeypatch):
    pretend_gpu(monkeypatch)
    write_manifest(engine, dataclasses.replace(read_manifest(engine), plugin_embedded=True))
    libraries.trt.write_text(libraries.trt.read_text() + " ")
    with pytest.raises(EngineError, match="is not the plugin library"):
        TensorRTRunner(engine).load()


def test_an_embedded_engine_whose_fallback_library_is_gone_names_both_ways_out(
        fake_trt, libraries, embedded_engine):
    libraries.trt_dyn.unlink()
    with pytest.raises(EngineError, match="pass --allow-engine-host-code if you built or trust the engine, or "):
        TensorRTRunner(embedded_engine).plugin_to_load()


def trtexec_engine(trt, libraries, model: onnx.ModelProto, tmp_path, monkeypatch):
    """An engine built from ``model`` whose manifest is gone (as trtexec or Polygraphy would leave it), loaded as by
    a process that did not build it."""
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    out = tmp_path / "trtexec.engine"
    build_engine(BuildOptions(path, out, plugin=libraries.trt))
    manifest_path(out).unlink()
    as_in_a_new_process(trt, monkeypatch)
    pretend_gpu(monkeypatch)
    return out


@pytest.mark.parametrize(("model", "dtype"), [
    (aggregate_model(source_type=TensorProto.FLOAT16), "float16"),  # float16 sources and output
    (aggregate_model(source_type=TensorProto.BFLOAT16), "bfloat16"),
    (aggregate_model(), "float32"),  # float32 inputs: a float16 export's are float16
    (past_model(TensorProto.FLOAT16), "float16"),  # float32 logits, float16 cache
    (past_model(TensorProto.FLOAT), "float32"),
])
def test_an_engine_without_manifest_takes_its_dtype_from_its_io_tensors(
        fake_trt, libraries, tmp_path, monkeypatch, model, dtype):
    out = trtexec_engine(fake_trt, libraries, model, tmp_path, monkeypatch)
    runner, found = engine_runner(out, plugin=libraries.trt)
    assert found == dtype and runner.manifest is None


def test_an_engine_whose_only_float_tensor_is_float32_logits_has_no_dtype_unless_stated(
        fake_trt, libraries, engine, monkeypatch):
    manifest_path(engine).unlink()  # built from the float16 export: int64 input_ids -> float32 logits
    pretend_gpu(monkeypatch)
    assert engine_runner(engine, plugin=libraries.trt)[1] is None
    assert engine_runner(engine, plugin=libraries.trt, dtype="float16")[1] == "float16"


def test_a_stated_dtype_the_io_tensors_contradict_is_refused_in_one_line(fake_trt, libraries, tmp_path, monkeypatch):
    out = trtexec_engine(fake_trt, libraries, past_model(TensorProto.FLOAT16), tmp_path, monkeypatch)
    with pytest.raises(EngineError, match="say it was exported in float16, not float32; pass --engine-dtype "
                                          "float16") as err:
        engine_runner(out, plugin=libraries.trt, dtype="float32")
    assert "\n" not in str(err.value)


def test_a_stated_dtype_the_manifest_contradicts_is_refused(fake_trt, engine):
    assert engine_runner(engine, dtype="float16")[1] == "float16"
    with pytest.raises(EngineError, match=r"built from a float16 ONNX \(its manifest m\.engine\.json\); it is not "
                                          "bfloat16"):
        engine_runner(engine, dtype="bfloat16")


def test_check_of_an_engine_whose_io_does_not_tell_its_dtype_asks_for_it_in_one_line(
        fake_trt, libraries, engine, block2_checkpoint, monkeypatch):
    manifest_path(engine).unlink()
    pretend_gpu(monkeypatch)
    result = CliRunner().invoke(app, ["check", str(block2_checkpoint), "--engine", str(engine),
                                      "--plugin", str(libraries.trt)])
    assert result.exit_code == 1
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert "do not tell its dtype" in line and "pass --engine-dtype float32|float16|bfloat16" in line


def test_check_refuses_an_unknown_engine_dtype_as_a_usage_error(fake_trt, engine, block2_checkpoint):
    result = CliRunner().invoke(app, ["check", str(block2_checkpoint), "--engine", str(engine),
                                      "--engine-dtype", "float64"])
    assert result.exit_code == 2
    assert "'float64' is not one of float32, float16, bfloat16" in result.output


def test_an_engine_with_neither_manifest_nor_plugin_says_what_is_missing(fake_trt, engine):
    manifest_path(engine).unlink()
    with pytest.raises(EngineError, match=r"m\.engine has no manifest m\.engine\.json .* pass --plugin LIB"):
        engine_runner(engine)


def test_check_without_manifest_or_plugin_exits_1_with_one_line(fake_trt, engine, block2_checkpoint):
    manifest_path(engine).unlink()
    result = CliRunner().invoke(app, ["check", str(block2_checkpoint), "--engine", str(engine)])
    assert result.exit_code == 1
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert "has no manifest m.engine.json" in line and "--plugin LIB" in line


def test_check_accepts_an_engine_without_manifest_when_given_the_plugin(
        fake_trt, libraries, engine, block2_checkpoint):
    manifest_path(engine).unlink()
    result = CliRunner().invoke(app, ["check", str(block2_checkpoint), "--engine", str(engine),
                                      "--plugin", str(libraries.trt), "--allow-engine-host-code"])
    assert result.exit_code == 1 and "needs a CUDA GPU" in result.output  # past the manifest, stopped by the GPU


def test_bench_of_an_engine_without_manifest_needs_shapes(fake_trt, libraries, engine):
    manifest_path(engine).unlink()
    result = CliRunner().invoke(app, ["bench", str(engine), "--plugin", str(libraries.trt)])
    assert result.exit_code == 1 and "pass --shapes B,T" in result.output


def test_bench_refuses_a_library_changed_since_the_build_in_one_line(fake_trt, libraries, engine, monkeypatch):
    pretend_gpu(monkeypatch)
    libraries.trt.write_text(libraries.trt.read_text() + " ")
    result = CliRunner().invoke(app, ["bench", str(engine), "--allow-engine-host-code"])
    assert result.exit_code == 1
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert "is not the plugin library m.engine was built with" in line
