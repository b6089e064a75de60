"""The routing-aware comparison (docs/parity.md#routing-aware-comparison): an artifact that breaks float64
near-ties between experts the other way is judged on its arithmetic against float64 run with its own choices, and
passes; an artifact whose router chooses far from float64's top-k fails, even where its logits agree."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from safetensors.torch import load_file, save_file

from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.models.decoder.example import write_example_folder
from attnres_export.parity.check import check_artifacts
from attnres_export.parity.report import Report
from attnres_export.parity.routing import router_choice_outputs
from tests.conftest import slow_after


def near_tie_folder(root: Path, factor: float) -> Path:
    """A 2-layer Qwen3-MoE folder routing top-1, where only experts 0 and 1 can win a token: router row 1 is row 0
    times ``factor`` (the others zero), and expert 1 computes minus expert 0 (times 10), so a flip between them
    moves the logits far beyond any bar. With ``factor`` 1 + 1e-4 every choice between them is a near-tie."""
    folder, _, _ = write_example_folder("qwen3_moe", root, seed=0)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"num_experts_per_tok": 1}))
    tensors = load_file(folder / "model.safetensors")
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.mlp."
        router, gate_up, down = (tensors[prefix + name] for name in
                                 ("gate.weight", "experts.gate_up_proj", "experts.down_proj"))
        router[2:] = 0
        router[1] = router[0] * factor
        gate_up[1] = gate_up[0]
        down[0] *= 10
        down[1] = -down[0]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def exported(folder: Path, dtype: str) -> Path:
    out = folder.with_name(f"{folder.name}.{dtype}.onnx")
    export_checkpoint(ExportOptions(folder, out, dtype=dtype, check=False))
    return out


@pytest.fixture(scope="module")
def near_tie_float16(tmp_path_factory) -> tuple[Path, Path]:
    """The near-tie folder and its float16 export (no check), shared by the fast cases."""
    folder = near_tie_folder(tmp_path_factory.mktemp("tie") / "tie", 1 + 1e-4)
    return folder, exported(folder, "float16")


def judged(tmp_path: Path, near_tie_float16: tuple[Path, Path], dtype: str, command: str) -> Report:
    """The report of ``attnres check`` or of ``attnres-export`` (its own check of the file it writes)."""
    if (dtype, command) == ("float16", "check"):
        return check_artifacts(*near_tie_float16[:1], [near_tie_float16[1]]).report
    folder = near_tie_folder(tmp_path / "tie", 1 + 1e-4)
    if command == "export":
        return export_checkpoint(ExportOptions(folder, tmp_path / "m.onnx", dtype=dtype)).report
    return check_artifacts(folder, [exported(folder, dtype)]).report


@pytest.mark.parametrize(("dtype", "command"), [
    *slow_after([("float16", "check"), ("float16", "export"), ("bfloat16", "check")]),
    pytest.param("bfloat16", "export", marks=[pytest.mark.slow, pytest.mark.full]),  # both dtypes and commands above
])
def test_a_half_export_that_breaks_near_ties_the_other_way_passes_on_its_own_routing(tmp_path, near_tie_float16,
                                                                                     dtype, command):
    report = judged(tmp_path, near_tie_float16, dtype, command)
    routing = report.extra["routing_aware"]
    assert routing["plain_checks"] and not any(check["ok"] for check in routing["plain_checks"])
    assert report.ok
    for check in routing["checks"]:
        assert check["flips"] > 0 and 0 < check["max_relative_regret"] <= check["tie_bar"]
        assert check["unforced_rel_l2"]["logits"] > check["metrics"]["logits"]["rel_l2_bar"]
    assert all(c.backend.endswith("+artifact-routing") for c in report.checks)


def test_the_routing_aware_comparison_reads_the_model_from_the_checkpoint_the_check_opened(near_tie_float16,
                                                                                        monkeypatch):
    """One open per command (parity/session.py): the references read the weights once, the routing-aware
    comparison once more from the same open checkpoint; nothing loads the checkpoint from its path again."""
    from tests.parity.test_session import Opened

    opened = Opened(monkeypatch)
    report = check_artifacts(*near_tie_float16[:1], [near_tie_float16[1]]).report
    assert "routing_aware" in report.extra
    assert (opened.opens, opened.models) == (1, 2)


def test_an_artifact_whose_router_chooses_far_from_the_top_k_fails_though_its_logits_agree(tmp_path,
                                                                                          near_tie_float16):
    """Exported where experts 0 and 1 nearly tie (its float16 router picks either), checked against the model where
    expert 1 is ahead by half its logit: every other weight is the same and top-1 weights are 1, so the logits agree
    with float64 run on the artifact's choices, and only the choices' regret (far over the tie bar) fails it."""
    result = check_artifacts(near_tie_folder(tmp_path / "checked", 1.5), [near_tie_float16[1]])
    rows = {name: metrics for check in result.report.checks for name, metrics in check.outputs.items()}
    assert not result.report.ok
    assert rows["logits"].ok
    choices = [metrics for name, metrics in rows.items() if name.startswith("expert-choices")]
    assert choices and not any(metrics.ok for metrics in choices)
    assert all(metrics.rel_l2 > 10 * metrics.rel_l2_bar for metrics in choices)


def test_the_choices_read_are_each_mlp_scopes_last_topk_in_layer_order():
    """Group-limited routers have three TopK nodes (group scores, groups, experts): the experts' is the last."""
    nodes = [onnx.helper.make_node("TopK", ["s", "k"], [f"v{name}", f"i{name}"], name=name) for name in (
        "model.layers.10.mlp/node_topk__1", "model.layers.2.mlp/node_topk__1", "model.layers.2.mlp/node_topk_1__1",
        "model.layers.2.mlp/node_topk_2__1", "model.layers.2.self_attn/node_topk__1", "node_topk_9")]
    graph = onnx.helper.make_graph(nodes, "g", [], [])
    assert router_choice_outputs(onnx.helper.make_model(graph)) == [
        "imodel.layers.2.mlp/node_topk_2__1", "imodel.layers.10.mlp/node_topk__1"]
