"""Outputs a person can read: tables whose rows stay one line at 80 columns, labels that say what a number is,
help that reads like docs/cli.md, `attnres inspect` on every file the exporter reads or writes, names a .pt2
export takes from its program, replays that move with their folder, and a word when an export holds nodes no
TensorRT plugin runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import typer
from onnx import TensorProto, helper
from rich.console import Console
from typer.testing import CliRunner

import attnres_export.exporter.export as export_module
from attnres_export.cli import app
from attnres_export.cli.render import fusion_table, report_table
from attnres_export.exporter.foreign import ForeignOptions, load_foreign, module_source
from attnres_export.exporter.options import ExportOptions, ExportResult
from attnres_export.exporter.program_names import summarize_program
from attnres_export.graphs.fusion import FusionResult, SiteOutcome
from attnres_export.graphs.fusion.classify import ATTENTION
from attnres_export.graphs.fusion.depth.pattern import ATTENTION_REASON, DEPTH
from attnres_export.parity.check import Artifact, CheckResult
from attnres_export.parity.metrics import ErrorMetrics
from attnres_export.parity.polygraphy_io import save_replays
from attnres_export.parity.report import Check, Report
from attnres_export.parity.types import References
from tests.graphs.fusion.foreign_models import StackEinsumLM
from tests.graphs.fusion.helpers import save_program

runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def printed(renderable, width: int) -> str:
    """``renderable`` as a console ``width`` columns wide shows it (the test session's COLUMNS=160 not used)."""
    console = Console(width=width, record=True)
    console.print(renderable)
    return console.export_text()


def fusion_sites() -> FusionResult:
    """Node names and reasons as long as a real model's (Hugging Face decoders name nodes by module path)."""
    sites = []
    for i in range(3):
        sites.append(SiteOutcome(f"model.layers.{i}.self_attn/node_Softmax_{137 + i}", False, ATTENTION_REASON,
                                 kind=ATTENTION))
        sites.append(SiteOutcome(
            f"/model/layers.{i}/aggregation/attention_over_depth/Softmax_{i}", i != 1,
            "" if i != 1 else "the weights do not sum over a stack of earlier sublayer outputs", sources=i + 1,
            eps=1e-6, rel_l2=1.234e-7 * (i + 1), kind=DEPTH, op_type="AttnResAggregate"))
    return FusionResult(onnx.ModelProto(), sites, {}, kinds={"AttnResAggregate": DEPTH})


def test_at_80_columns_each_fusion_site_is_one_line_and_each_reason_is_written_whole_once():
    fusion = fusion_sites()
    text = printed(fusion_table(fusion), 80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    for site in fusion.sites:
        node = site.site.rsplit("/", 1)[1]
        rows = [line for line in lines if re.search(rf"{re.escape(node)}\b", line)]
        assert len(rows) == 1, (site.site, text)
        result = "left alone" if site.op_type is None else "fused" if site.fused else "unfused"
        assert result in rows[0] and (not site.rel_l2 or f"{site.rel_l2:.2g}" in rows[0].split()), (rows, text)
    flat = " ".join(text.split())
    for reason in {s.reason for s in fusion.sites if s.reason}:
        assert flat.count(reason) == 1, (reason, text)


def bfloat16_report(with_past: bool = False) -> Report:
    """A passing bfloat16 check judged against float64, whose max rel is large where the reference is near 0."""
    metrics = ErrorMetrics(0.0213, 32.1, 0.0061, 0.99998, True, 0.0008, 0.03, 0.999, 0.0055)
    shapes = ([1, 8, 0], [8, 1, 63]) if with_past else ([1, 64], [8, 1])
    return Report([Check(list(shape), "onnxruntime+ref-ops+bf16-emulation", "m.bfloat16.tensorrt.onnx", "bfloat16",
                         {"logits": metrics}) for shape in shapes], {"with_past": True} if with_past else {})


@pytest.mark.parametrize("width", [80, 220])
def test_a_passing_row_shows_no_max_rel_and_its_two_rel_l2_columns_say_whose_error_they_are(width):
    report = bfloat16_report()
    text = printed(report_table(report), width)
    assert "32.1" not in text.split() and "max rel" not in text, text
    assert report.to_dict()["checks"][0]["outputs"]["logits"]["max_rel"] == 32.1
    header = next(line for line in text.splitlines() if line.lstrip().startswith(("shape", "backend")))
    assert header.count("rel L2") == 3, text
    assert "f32 rel L2" in header and "16-bit rel L2" in header, text


@pytest.mark.parametrize("width", [80, 40])
def test_with_past_shapes_are_labelled_batch_new_past(width):
    text = printed(report_table(bfloat16_report(with_past=True)), width)
    assert "batch x new tokens x past tokens" in " ".join(text.split()), text
    assert "batch x new" not in printed(report_table(bfloat16_report()), width)


def command_helps() -> dict[str, str]:
    helps = {}
    group = typer.main.get_command(app)
    context = group.context_class(group, info_name="attnres")
    for name in group.list_commands(context):
        result = runner.invoke(app, [name, "--help"], prog_name="attnres", env={"COLUMNS": "120"})
        assert result.exit_code == 0, result.output
        helps[name] = result.output
    return helps


def test_help_names_arguments_and_values_as_the_docs_do_and_says_ranges_in_words():
    helps = command_helps()
    for name, text in helps.items():
        usage = text.splitlines()[0]
        assert "{" not in usage and not re.search(r"<(list\[|int|str|float)", text), (name, text)
    assert helps["fuse"].splitlines()[0] == "Usage: attnres fuse [OPTIONS] MODEL"
    assert helps["convert-checkpoint"].splitlines()[0] == "Usage: attnres convert-checkpoint [OPTIONS] SOURCE OUT_DIR"
    assert "--import MODULE" in helps["export"] and "--onnx PATH" in helps["check"]
    export = " ".join(helps["export"].split())
    assert "9223372036854775807" not in export and "<=x" not in export
    assert "Seed of the random inputs (0 to 2^63-1)." in export and "ONNX opset (18 to 23)." in export


def test_the_seed_range_is_still_enforced():
    result = invoke("export", "absent.pt", "--seed", str(2**63))
    assert result.exit_code == 2 and "--seed" in result.output


def test_a_one_layer_block_is_singular(tmp_path):
    result = invoke("example", tmp_path / "q", "--arch", "qwen3", "--layers", "1", "--block-size", "1")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # the line wraps where a long temporary path (pytest -n) pushes it
    assert "1 layer a block" in text and "1 layer," in text and "layers" not in text


def plain_onnx_model() -> onnx.ModelProto:
    """What torch.onnx (or any tool) writes: standard ops, no attnres metadata."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_inspect_says_a_plain_onnx_has_no_attnres_target(tmp_path):
    path = tmp_path / "plain.onnx"
    onnx.save(plain_onnx_model(), str(path))
    result = invoke("inspect", path)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "target portable" not in text and "target none" in text and "not written by attnres-export" in text


def test_inspect_reads_a_pt2_program_and_names_it_as_the_export_does(tmp_path):
    program = save_program(StackEinsumLM().eval(), tmp_path / "m.pt2")
    result = invoke("inspect", program)
    assert result.exit_code == 0, result.output
    rows = {line.split()[1]: line.split() for line in result.output.splitlines()
            if line.startswith(("input ", "output "))}
    assert rows["input_ids"][2:] == ["int64", "batch", "x", "seq"]
    assert rows["output"][2:] == ["float32", "batch", "x", "seq", "x", "50"]
    assert "softmaxes" in result.output and re.search(r"batch\s+1 to 8", result.output), result.output


def test_inspect_refuses_a_pt2_that_is_no_program_in_one_line(tmp_path):
    archive = tmp_path / "weights.pt2"
    archive.write_bytes(b"not a zip archive")
    result = invoke("inspect", archive)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "not a torch.export program" in lines[0] and "corrupted" not in lines[0]


def dims(value: onnx.ValueInfoProto) -> list[str | int]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_a_pt2_export_names_outputs_and_dims_from_the_program_signature(tmp_path):
    program = save_program(StackEinsumLM().eval(), tmp_path / "m.pt2")
    source = load_foreign("program", ExportOptions(program, tmp_path / "m.onnx"), ForeignOptions())
    graph = source.onnx.graph
    assert [(v.name, dims(v)) for v in [*graph.input, *graph.output]] == [
        ("input_ids", ["batch", "seq"]), ("output", ["batch", "seq", 50])]
    named = {d.dim_param for v in graph.value_info for d in v.type.tensor_type.shape.dim if d.dim_param}
    assert not [name for name in named if re.search(r"\bs\d+\b", name)], named


class TwoHeads(torch.nn.Module):
    """Returns a dict, as Hugging Face models do, of a plain and a derived tensor."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": torch.relu(x) * mask, "hidden": torch.tanh(x)[:, 1:]}


def test_a_module_returning_a_dict_exports_outputs_named_by_its_keys():
    x, mask = torch.randn(2, 5, 3), torch.ones(2, 5, 3)
    auto = {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}
    source = module_source(TwoHeads(), (x, mask), {}, [auto, auto], 18)
    graph = source.onnx.graph
    assert [(v.name, dims(v)) for v in graph.output] == [("logits", ["batch", "seq", 3]),
                                                         ("hidden", ["batch", "seq - 1", 3])]
    assert [dims(v) for v in graph.input] == [["batch", "seq", 3], ["batch", "seq", 3]]


class Nested(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict:
        return {"y": x * 2, "z": (x + 1, x[1:])}


def test_a_program_is_summarized_with_the_keys_it_returns_and_its_open_ranges():
    program = torch.export.export(Nested(), (torch.randn(4, 3),), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    summary = summarize_program(program)
    assert summary.inputs == [("x", "float32", ["batch", "3"])]
    assert summary.outputs == [("y", "float32", ["batch", "3"]), ("z.0", "float32", ["batch", "3"]),
                               ("z.1", "float32", ["batch - 1", "3"])]
    assert summary.dims == [("batch", 2, None)]


def test_replay_scripts_name_their_files_relative_to_their_folder_and_run_from_anywhere(tmp_path):
    model = tmp_path / "work" / "m.portable.onnx"
    model.parent.mkdir()
    model.write_bytes(b"stand-in: the fake polygraphy only checks that the files exist")
    shape = (2, 4)
    feeds = {shape: {"input_ids": np.zeros(shape, dtype=np.int64)}}
    reference = {shape: {"logits": np.ones((2, 4, 3), dtype=np.float32)}}
    metrics = ErrorMetrics(1e-7, 1e-6, 1e-7, 1.0, True, None, 1e-5, 0.999999)
    result = CheckResult(Report([Check(list(shape), "onnxruntime", model.name, "float32", {"logits": metrics})]),
                         [Artifact(model, "float32", False, {}, {}, {}, {}, "portable", lambda: None)],
                         [References([shape], feeds, reference, None)], [shape])
    [replay] = save_replays(tmp_path / "work" / "pg", result)
    script = replay.script.read_text()
    assert str(tmp_path) not in script and 'cd "$(dirname "$0")"' in script, script

    moved = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "work", moved)
    shutil.rmtree(tmp_path / "work")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "polygraphy"
    fake.write_text('#!/bin/sh\nfor a; do case "$a" in *.json|*.onnx) test -f "$a" || { echo "missing $a"; exit 3; } '
                    ';; esac; done\necho ran\n')
    fake.chmod(0o755)
    run = subprocess.run(["sh", str(moved / "pg" / model.name / "replay.sh")], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert run.returncode == 0 and run.stdout.strip() == "ran", run.stdout + run.stderr


def fake_export(fused_by_type: dict[str, int]):
    def export_any(opts, foreign, status=lambda _: None):
        out = Path(opts.resolved_output())
        out.write_bytes(b"onnx")
        return ExportResult(out, [out], sum(fused_by_type.values()), 0, None, fused_by_type)

    return export_any


@pytest.mark.parametrize("target", ["tensorrt", "portable"])
def test_an_export_with_nodes_no_tensorrt_plugin_runs_says_so_in_one_line(tmp_path, monkeypatch, target):
    monkeypatch.setattr(export_module, "export_any", fake_export({"AttnResAggregate": 4, "KimiDeltaAttention": 3}))
    (tmp_path / "k3").mkdir()
    (tmp_path / "k3" / "config.json").write_text("{}")  # a folder without one is refused before export_any
    result = invoke("export", tmp_path / "k3", "--no-check", "--target", target, "-o", tmp_path / "k3.onnx")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if "nodes have no TensorRT plugin" in line]
    if target == "portable":
        assert not warnings, result.output
    else:
        assert len(warnings) == 1 and "3 KimiDeltaAttention" in warnings[0] and "--target portable" in warnings[0]
