"""``attnres-export`` on foreign models (.pt2, .onnx, pickled modules) and ``attnres fuse``, through the CLI."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from typer.testing import CliRunner

from attnres_export.cli import app
from attnres_export.ops.opset import AGGREGATE
from tests.conftest import slow_after
from tests.graphs.fusion.foreign_models import (
    POSITIVE,
    RMSNormSublayersLM,
    StackEinsumLM,
    TinyEpsZerosPartialLM,
    TokenMajorLM,
)
from tests.graphs.fusion.helpers import fused_count, matches_torch, plain_onnx, save_program

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.slow
@pytest.mark.parametrize("style", slow_after(sorted(POSITIVE)))
def test_pt2_program_exports_with_one_fused_node_per_aggregation_and_matches_torch(style, tmp_path):
    model = POSITIVE[style]().eval()
    program = save_program(model, tmp_path / f"{style}.pt2")
    out, report = tmp_path / f"{style}.onnx", tmp_path / "report.json"
    result = invoke("export", program, "-o", out, "--report", report)
    assert result.exit_code == 0, result.output
    fused = onnx.load(str(out))
    assert fused_count(fused) == model.aggregations
    data = json.loads(report.read_text())
    assert data["ok"] and data["fusion"]["fused_by_op"] == {AGGREGATE: model.aggregations}
    assert matches_torch(fused, model)


@pytest.mark.slow
def test_onnx_input_with_portable_target_has_no_attnres_nodes_and_passes_parity(tmp_path):
    source = tmp_path / "plain.onnx"
    onnx.save(plain_onnx(TokenMajorLM, opset=18), str(source))
    out = tmp_path / "portable.onnx"
    result = invoke("export", source, "--target", "portable", "-o", out)
    assert result.exit_code == 0, result.output
    assert fused_count(onnx.load(str(out))) == 0
    assert "5 found, 5 fused" in result.output


@pytest.mark.slow
def test_fuse_command_writes_the_fused_model_and_a_json_report(tmp_path):
    source = tmp_path / "plain.onnx"
    onnx.save(plain_onnx(StackEinsumLM, opset=18), str(source))
    out, report = tmp_path / "fused.onnx", tmp_path / "fuse.json"
    result = invoke("fuse", source, "-o", out, "--report", report, "--example-shape", "input_ids:3,4")
    assert result.exit_code == 0, result.output
    assert fused_count(onnx.load(str(out))) == 5
    data = json.loads(report.read_text())
    assert data["by_op"][AGGREGATE] == {"kind": "depth aggregation", "found": 5, "fused": 5, "unfused": 0}
    assert data["fused_by_op"] == {AGGREGATE: 5} and data["parity"]["ok"] and data["warnings"] == {}


def test_a_block_attnres_whose_rms_eps_of_1e_8_the_exporter_dropped_fuses_with_it_put_back_and_matches_torch(tmp_path):
    """TinyEpsZerosPartialLM's plain export (opset 20, torch.onnx.export's default) lost its eps, so the all-zero
    partial of each block's first sublayer is 0 / 0 and the whole graph NaN: attnres fuse exited 1. The eps goes back
    into every norm without one, which the one warning line says, and the fused model matches PyTorch."""
    model = TinyEpsZerosPartialLM().eval()
    source, out, report = tmp_path / "tiny_eps.onnx", tmp_path / "fused.onnx", tmp_path / "fuse.json"
    onnx.save(plain_onnx(TinyEpsZerosPartialLM, opset=20), str(source))
    result = invoke("fuse", source, "-o", out, "--report", report)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert text.count("RMS norm without eps") == 1 and "was put back" in text and "optimize=False" in text
    data = json.loads(report.read_text())
    assert data["fused_by_op"] == {AGGREGATE: model.aggregations} and data["parity"]["ok"]
    assert all(s["eps"] == pytest.approx(1e-8) for s in data["sites"])
    assert matches_torch(onnx.load(str(out)), model)


def test_rms_norms_that_lost_their_eps_outside_any_aggregation_are_named_in_one_warning_line_with_the_fix(tmp_path):
    """RMSNormSublayersLM's sublayer norms (eps 1e-8) lost their eps in the plain export while its aggregations kept
    theirs: fused and exit 0 as before, but the graph is not the PyTorch model, which one line now says."""
    source, out, report = tmp_path / "rms.onnx", tmp_path / "fused.onnx", tmp_path / "fuse.json"
    onnx.save(plain_onnx(RMSNormSublayersLM, opset=18), str(source))
    result = invoke("fuse", source, "-o", out, "--report", report)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "RMS norm without eps" in line]
    text = " ".join(result.output.split())
    assert len(lines) == 1 and "optimize=False" in text and ".pt2 program" in text and "was put back" not in text
    data = json.loads(report.read_text())
    assert data["fused_by_op"] == {AGGREGATE: RMSNormSublayersLM.aggregations}
    assert [len(places) for places in data["warnings"].values()] == [2]
    assert all(s["eps"] == pytest.approx(1e-6) for s in data["sites"])


def test_pickled_module_without_trust_pickle_is_refused_in_one_line_and_writes_nothing(tmp_path):
    path = tmp_path / "whole.pt"
    torch.save(StackEinsumLM().eval(), path)
    out = tmp_path / "whole.onnx"
    result = invoke("export", path, "-o", out)
    assert result.exit_code == 1
    message = " ".join(result.output.split())
    assert "arbitrary code" in message and "--trust-pickle" in message and ".pt2" in message
    assert "Traceback" not in result.output and not out.exists()


@pytest.mark.slow
def test_pickled_module_with_trust_pickle_and_example_shape_is_fused(tmp_path):
    model = StackEinsumLM().eval()
    path = tmp_path / "whole.pt"
    torch.save(model, path)
    out = tmp_path / "whole.onnx"
    result = invoke("export", path, "-o", out, "--trust-pickle", "--import", "tests.graphs.fusion.foreign_models",
                    "--example-shape", "input_ids:2,7:int64")
    assert result.exit_code == 0, result.output
    fused = onnx.load(str(out))
    assert fused_count(fused) == model.aggregations
    assert matches_torch(fused, model)


def test_pt2_file_that_is_not_an_exported_program_is_refused_in_one_line(tmp_path):
    path = tmp_path / "weights.pt2"
    torch.save({"w": torch.zeros(2)}, path)
    result = invoke("export", path, "-o", tmp_path / "x.onnx")
    assert result.exit_code == 1
    assert "not a torch.export program" in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_pt2_parity_is_against_the_pytorch_program_so_an_exporter_error_fails(tmp_path, monkeypatch):
    """An ONNX that drifted from PyTorch while exporting (simulated: one weight scaled by 1.01) still matches its
    own unfused graph; only the comparison with the program itself catches it."""
    import numpy as np
    from onnx import numpy_helper

    from attnres_export.exporter import foreign

    exported = foreign._onnx_with_feeds

    def drifting(*args, **kwargs):
        model, feeds = exported(*args, **kwargs)
        weight = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
        weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.01, weight.name))
        return model, feeds

    monkeypatch.setattr(foreign, "_onnx_with_feeds", drifting)
    program = save_program(StackEinsumLM().eval(), tmp_path / "m.pt2")
    out, report = tmp_path / "m.onnx", tmp_path / "r.json"
    result = invoke("export", program, "-o", out, "--report", report)
    assert result.exit_code == 1, result.output
    data = json.loads(report.read_text())
    assert data["reference"] == "the PyTorch program" and not data["ok"]
    assert data["checks"][0]["artifact"] == "exported vs the PyTorch program"
    assert not out.exists() and (tmp_path / "m.failed.onnx").exists()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_pt2_exports_in_half_precision_fusing_every_aggregation_at_the_dtypes_bar(tmp_path, dtype):
    model = StackEinsumLM().eval()
    program = save_program(model, tmp_path / "m.pt2")
    out, report = tmp_path / f"m.{dtype}.onnx", tmp_path / "r.json"
    result = invoke("export", program, "-o", out, "--dtype", dtype, "--report", report)
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["dtype"] == dtype and data["ok"] and data["fusion"]["fused_by_op"] == {AGGREGATE: model.aggregations}
    assert data["reference"] == "the PyTorch module"
    elem = {"float16": onnx.TensorProto.FLOAT16, "bfloat16": onnx.TensorProto.BFLOAT16}[dtype]
    assert elem in {i.data_type for i in onnx.load(str(out)).graph.initializer}


@pytest.mark.slow
def test_an_onnx_runtime_crash_on_a_foreign_model_is_one_line(tmp_path, monkeypatch):
    """A segfault inside ONNX Runtime must not end our process: the first run happens in a child process, whose
    death by a signal becomes one line (simulated: the child is reported killed by SIGSEGV)."""
    import subprocess

    from attnres_export.backends.onnxruntime import isolated_run

    def killed(*args, **kwargs):
        return subprocess.CompletedProcess(args, -11, "", "")

    monkeypatch.setattr(isolated_run.subprocess, "run", killed)
    source = tmp_path / "plain.onnx"
    onnx.save(plain_onnx(StackEinsumLM, opset=18), str(source))
    result = invoke("fuse", source, "-o", tmp_path / "out.onnx")
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "ONNX Runtime crashed running it (SIGSEGV)" in lines[0]
    assert not (tmp_path / "out.onnx").exists()


def test_the_isolated_first_run_passes_a_healthy_model():
    from attnres_export.backends.onnxruntime.isolated_run import crash_in_isolation
    from tests.graphs.fusion.foreign_models import example_ids

    model = plain_onnx(StackEinsumLM, opset=18)
    assert crash_in_isolation(model.SerializeToString(), {model.graph.input[0].name: example_ids().numpy()}) is None


def test_a_graph_that_is_only_nominally_dynamic_names_the_input_needing_example_shape(tmp_path):
    from onnx import TensorProto, numpy_helper
    from onnx import helper as oh

    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [10, 4])
    shape = numpy_helper.from_array(np.array([10, 4], dtype=np.int64), "shape")
    graph = oh.make_graph([oh.make_node("Reshape", ["x", "shape"], ["y"])], "g", [x], [y], initializer=[shape])
    source = tmp_path / "static.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]), str(source))
    result = invoke("fuse", source, "-o", tmp_path / "out.onnx")
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "--example-shape NAME:d0,d1,... for x" in lines[0]
    ok = invoke("fuse", source, "-o", tmp_path / "out.onnx", "--example-shape", "x:2,5,4")
    assert ok.exit_code == 0, ok.output
