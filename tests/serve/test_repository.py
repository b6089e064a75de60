"""``attnres triton-repo``: configs parse as Triton's own ModelConfig, the repository is written atomically, and
what a stock Triton cannot run is refused in one line. Engines go through the TensorRT fake (tests/engine)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from attnres_export.backends.tensorrt.builder import BuildOptions, build_engine
from attnres_export.cli import app
from attnres_export.dims import DimRange
from attnres_export.serve.dependencies import model_config_pb2
from attnres_export.serve.repository import RepoOptions, write_repository
from tests.serve.conftest import NEEDS_CLIENT

pytestmark = NEEDS_CLIENT
runner = CliRunner()


def parse(text: str):
    from google.protobuf import text_format

    return text_format.Parse(text, model_config_pb2().ModelConfig())


def one_line_error(result, pattern: str) -> None:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert pattern in lines[0], lines[0]


def test_a_portable_onnx_becomes_an_onnxruntime_model_with_its_real_io(portable_onnx, tmp_path):
    repo = tmp_path / "repo"
    result = runner.invoke(app, ["triton-repo", str(portable_onnx), "-o", str(repo), "--instances", "2"])
    assert result.exit_code == 0, result.output
    model = repo / "tiny.portable"
    assert sorted(p.relative_to(model).as_posix() for p in model.rglob("*")) == ["1", "1/model.onnx",
                                                                                   "config.pbtxt"]
    config = parse((model / "config.pbtxt").read_text())
    assert config.name == "tiny.portable" and config.backend == "onnxruntime" and config.max_batch_size == 16
    assert [(t.name, list(t.dims)) for t in config.input] == [("input_ids", [-1])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("logits", [-1, 4])]
    schema = model_config_pb2()
    assert config.input[0].data_type == schema.DataType.TYPE_INT64
    assert config.output[0].data_type == schema.DataType.TYPE_FP32
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000
    assert [(g.count, g.kind) for g in config.instance_group] == [(2, schema.ModelInstanceGroup.KIND_CPU)]
    assert (model / "1" / "model.onnx").read_bytes() == portable_onnx.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo", "tiny.portable.onnx"]  # no temporaries left
    assert [p.name for p in repo.iterdir()] == ["tiny.portable"]


def test_gpus_give_one_instance_group_each_and_max_batch_is_bounded_by_the_export(portable_onnx, tmp_path):
    result = write_repository(RepoOptions(portable_onnx, tmp_path / "r", "m", gpus=[0, 1], max_batch=8))
    config = parse(result.config)
    assert config.max_batch_size == 8 and [list(g.gpus) for g in config.instance_group] == [[0], [1]]
    assert all(g.kind == model_config_pb2().ModelInstanceGroup.KIND_GPU for g in config.instance_group)
    bad = runner.invoke(app, ["triton-repo", str(portable_onnx), "-o", str(tmp_path / "r2"), "--max-batch", "17"])
    one_line_error(bad, "--max-batch 17 is over the batch range")
    assert not (tmp_path / "r2" / "tiny.portable").exists()


def test_a_tensorrt_target_onnx_is_refused_for_the_onnxruntime_backend(attnres_onnx, tmp_path):
    result = runner.invoke(app, ["triton-repo", str(attnres_onnx), "-o", str(tmp_path / "repo")])
    one_line_error(result, "domain attnres, which Triton's stock onnxruntime backend cannot run")
    assert "attnres convert" in result.output and "--target portable" in result.output
    assert not (tmp_path / "repo").exists() and [p.name for p in tmp_path.iterdir()] == ["agg.tensorrt.onnx"]


def test_an_existing_model_folder_is_replaced_only_with_overwrite(portable_onnx, tmp_path):
    repo = tmp_path / "repo"
    write_repository(RepoOptions(portable_onnx, repo, "m"))
    (repo / "m" / "stale.txt").write_text("old")
    again = runner.invoke(app, ["triton-repo", str(portable_onnx), "-o", str(repo), "--model-name", "m"])
    one_line_error(again, "exists; pass --overwrite")
    assert (repo / "m" / "stale.txt").exists()
    write_repository(RepoOptions(portable_onnx, repo, "m", instances=3, overwrite=True))
    assert not (repo / "m" / "stale.txt").exists() and "count: 3" in (repo / "m" / "config.pbtxt").read_text()
    assert sorted(p.name for p in repo.iterdir()) == ["m"]


@pytest.mark.parametrize(("args", "pattern"), [
    (["--model-name", "a/b"], "model name 'a/b'"),
    (["--instances", "0"], "--instances 0"),
    (["--gpus", "x"], "--gpus 'x'"),
    (["--cuda-graphs"], "--cuda-graphs applies to TensorRT engines only"),
])
def test_bad_options_are_one_line(portable_onnx, tmp_path, args, pattern):
    one_line_error(runner.invoke(app, ["triton-repo", str(portable_onnx), "-o", str(tmp_path / "r"), *args]), pattern)


def test_an_invalid_config_is_caught_by_tritons_schema():
    from attnres_export.serve.dependencies import ServeError
    from attnres_export.serve.repository import validate_config
    from attnres_export.serve.signature import Signature, TensorSpec

    signature = Signature((TensorSpec("x", "int64", (-1, -1)),), (TensorSpec("y", "float32", (-1, 4)),), 4)
    with pytest.raises(ServeError, match="does not parse as Triton's ModelConfig"):
        validate_config('name: "m"\nmax_batch_size: 4\ninstance_groups [ { count: 1 } ]\n', signature, "onnxruntime")
    with pytest.raises(ServeError, match="every instance group needs count >= 1"):
        validate_config('name: "m"\nbackend: "onnxruntime"\nmax_batch_size: 4\ninput [ { name: "x" data_type: '
                        'TYPE_INT64 dims: [ -1 ] } ]\noutput [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                        'instance_group [ { count: 0 } ]\n', signature, "onnxruntime")


def test_an_engine_becomes_a_tensorrt_plan_model_with_its_plugin_and_a_group_per_profile(fake_engine, tmp_path):
    repo = tmp_path / "repo"
    result = runner.invoke(app, ["triton-repo", str(fake_engine), "-o", str(repo), "--cuda-graphs", "--gpus", "0"])
    assert result.exit_code == 0, result.output
    model = repo / "m"
    assert sorted(p.relative_to(model).as_posix() for p in model.rglob("*")) == [
        "1", "1/model.plan", "config.pbtxt", "plugins", "plugins/libattnres_trt.so"]
    config = parse((model / "config.pbtxt").read_text())
    schema = model_config_pb2()
    assert config.platform == "tensorrt_plan" and config.max_batch_size == 4 and config.optimization.cuda.graphs
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [("input_ids", schema.DataType.TYPE_INT64,
                                                                            [-1])]
    assert [t.name for t in config.output] == ["logits"]
    assert config.output[0].data_type == schema.DataType.TYPE_FP32
    assert [(list(g.profile), list(g.gpus), g.kind) for g in config.instance_group] == [
        (["0"], [0], schema.ModelInstanceGroup.KIND_GPU)]
    assert f"--backend-config=tensorrt,plugins={(model / 'plugins' / 'libattnres_trt.so').resolve()}" in " ".join(
        result.output.split())


def test_an_engine_with_its_plugin_embedded_needs_no_library_but_the_version_compatible_option(
        fake_trt, libraries, portable_onnx, tmp_path, monkeypatch):
    import torch

    from attnres_export.backends.tensorrt import plugin_library

    engine = tmp_path / "e.engine"
    assert build_engine(BuildOptions(portable_onnx, engine, plugin=libraries.trt_dyn, embed_plugin=True,
                                     batch=DimRange(1, 2, 4))).manifest.plugin_embedded
    fake_trt.get_plugin_registry()._creators.clear()  # as a process that did not build the engine
    monkeypatch.setattr(plugin_library, "_loaded", {}, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    repo = tmp_path / "repo"
    result = runner.invoke(app, ["triton-repo", str(engine), "-o", str(repo), "--allow-engine-host-code"])
    assert result.exit_code == 0, result.output
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) == [
        "e", "e/1", "e/1/model.plan", "e/config.pbtxt"]
    launch = " ".join(result.output.split())
    assert "--backend-config=tensorrt,version-compatible=true" in launch and "plugins=" not in launch
    assert "the plugin is embedded" in launch
