"""Nothing numerically wrong passes a parity check (docs/parity.md): a bar never widens because float32 PyTorch breaks
an expert near-tie the other way (its flips are no arithmetic error), and a flip's regret does not shrink when a
constant is added to every router correction bias (which changes no choice)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from safetensors.torch import load_file, save_file

from attnres_export.dtypes import Tolerance
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.models import load_checkpoint
from attnres_export.models.decoder.example import write_example_folder
from attnres_export.models.routing import RoutingTrace
from attnres_export.parity.check import check_artifacts
from attnres_export.parity.feeds import checkpoint_subject
from attnres_export.parity.metrics import compare
from attnres_export.parity.routing import TIE_FACTOR, flip_regrets, run_routed
from attnres_export.parity.session import reference_outputs
from tests.parity.test_routing import near_tie_folder

LOOSE = Tolerance(float("inf"), -1.0)
FLOAT32_BAR = 1e-5


@dataclass(frozen=True)
class Pair:
    """A folder, its correct float32 export (no check) and a wrong copy of that export."""

    folder: Path
    good: Path
    wrong: Path


def float32_export(folder: Path) -> Path:
    out = folder.with_name(f"{folder.name}.float32.onnx")
    export_checkpoint(ExportOptions(folder, out, check=False))
    return out


def edited(onnx_path: Path, name_part: str, edit, out: Path) -> Path:
    """A copy of ``onnx_path`` whose initializers named with ``name_part`` are ``edit(values)``."""
    model = onnx.load(str(onnx_path))
    hits = [i for i in model.graph.initializer if name_part in i.name]
    assert hits, name_part
    for init in hits:
        init.CopyFrom(numpy_helper.from_array(edit(numpy_helper.to_array(init).copy()), init.name))
    onnx.save(model, str(out))
    return out


@pytest.fixture(scope="module")
def ties_folder(tmp_path_factory) -> Path:
    """Qwen3-MoE routing top-1 between experts 0 and 1 whose router rows differ by 4e-7 (relative): float32
    PyTorch breaks some of these ties the other way from float64, and each flip negates the expert's output."""
    return near_tie_folder(tmp_path_factory.mktemp("f32ties") / "tie", 1 + 4e-7)


@pytest.fixture(scope="module")
def float32_ties(ties_folder) -> Pair:
    """Its float32 export, and a wrong copy whose lm_head is scaled by 1.003: every logit 0.3% off, 300x the
    float32 bar."""
    good = float32_export(ties_folder)
    wrong = edited(good, "lm_head", lambda w: w * np.float32(1.003), ties_folder.with_name("wrong.onnx"))
    return Pair(ties_folder, good, wrong)


def test_float32_pytorch_runs_with_float64s_expert_choices_so_its_own_flips_widen_no_bar(ties_folder):
    model = load_checkpoint(ties_folder, dtype=None)[0]
    shapes = [(8, 1), (1, 64)]
    references = reference_outputs(checkpoint_subject(model, False, "float32", 0), shapes)
    own_flips = 0
    for shape in shapes:
        _, trace = run_routed(model, references.feeds[shape], "float32")
        own_flips += sum(int((a != b).any(-1).sum()) for a, b in zip(trace.chosen, references.choices[shape],
                                                                       strict=True))
        error = compare(references.expected[shape]["logits"], references.exact[shape]["logits"], LOOSE)
        assert error.rel_l2 < FLOAT32_BAR, (shape, error.rel_l2)
    assert own_flips, "the folder no longer makes float32 PyTorch break a tie; tighten its router rows"


@pytest.mark.slow
def test_check_fails_an_artifact_0_3_percent_off_where_float32_pytorch_breaks_near_ties(float32_ties):
    """Before, float32 PyTorch's own flips put it 1e-2 from float64; the bar became 4x that and passed this file."""
    report = check_artifacts(float32_ties.folder, [float32_ties.wrong], shapes=[(8, 1)]).report
    logits = [check.outputs["logits"] for check in report.checks]
    assert not report.ok
    assert logits and all(not m.ok and m.rel_l2_bar == FLOAT32_BAR for m in logits)


@pytest.mark.slow
def test_the_correct_float32_export_of_that_folder_still_passes(float32_ties):
    report = check_artifacts(float32_ties.folder, [float32_ties.good], shapes=[(8, 1), (1, 64)]).report
    assert report.ok, report.to_dict()


def regrets_under_bias(constant: float) -> float:
    """The largest regret of flipped choices on random sigmoid scores with random correction biases plus
    ``constant``: each token takes its 2nd and 4th best experts instead of its top-2."""
    generator = torch.Generator().manual_seed(0)
    unbiased = torch.rand(32, 16, generator=generator, dtype=torch.float64)
    bias = 0.05 * torch.randn(16, generator=generator, dtype=torch.float64)
    order = (unbiased + bias).argsort(dim=-1, descending=True)
    trace = RoutingTrace([order[:, [1, 3]]])
    trace.top_k(unbiased + bias + constant, 2, unbiased)
    choices, flips, regret = flip_regrets(trace)
    assert flips == choices == 32
    return regret


@pytest.mark.parametrize("constant", [1.0, 1e3, 1e6])
def test_adding_a_constant_to_every_correction_bias_leaves_every_regret_unchanged(constant):
    assert regrets_under_bias(constant) == pytest.approx(regrets_under_bias(0.0), rel=1e-6)
    assert regrets_under_bias(constant) > 1e-3


def constant_bias_folder(root: Path, bias: float) -> Path:
    """The DeepSeek-V3 example without a group limit (every expert can win) and every correction bias ``bias``."""
    folder, config, _ = write_example_folder("deepseek_v3", root)
    written = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(written | {"topk_group": config["n_group"]}))
    tensors = load_file(folder / "model.safetensors")
    for name, tensor in tensors.items():
        if name.endswith("e_score_correction_bias"):
            tensor.fill_(bias)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def bias_folder(tmp_path_factory) -> Path:
    """Every correction bias 1e6."""
    return constant_bias_folder(tmp_path_factory.mktemp("bias") / "ds", 1e6)


@pytest.fixture(scope="module")
def constant_bias(bias_folder) -> Pair:
    """The bias folder's export and a wrong copy whose experts 0 and 1 have bias 1e6 + 1: it routes every token to
    them, far from float64's choices (the forced logits still agree: only the choices are wrong)."""
    folder = bias_folder
    good = float32_export(folder)

    def two_experts(bias: np.ndarray) -> np.ndarray:
        bias[:2] += 1
        return bias

    return Pair(folder, good, edited(good, "e_score_correction_bias", two_experts, folder.with_name("two.onnx")))


def test_the_routers_regret_is_the_same_with_and_without_a_constant_bias(bias_folder):
    """The model's own router (not a synthetic trace) forced to experts 0 and 1 for every token."""
    model = load_checkpoint(bias_folder, dtype=None)[0]
    feeds = model.random_inputs(1, 16, np.random.default_rng(0))
    forced = [torch.tensor([[0, 1]] * 16)]
    biased = flip_regrets(run_routed(model, feeds, "float64", forced)[1])
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.zero_()
    unbiased = flip_regrets(run_routed(model, feeds, "float64", forced)[1])
    assert biased[:2] == unbiased[:2] and biased[1] > 0
    assert biased[2] == pytest.approx(unbiased[2], rel=1e-6)
    assert biased[2] > 100 * TIE_FACTOR * FLOAT32_BAR


@pytest.mark.slow
def test_check_fails_an_artifact_that_routes_every_token_to_two_experts_under_a_constant_bias(constant_bias):
    result = check_artifacts(constant_bias.folder, [constant_bias.wrong])
    routing = result.report.extra["routing_aware"]
    assert not result.report.ok
    for check in routing["checks"]:
        assert check["flips"] >= 0.75 * check["choices"]
        assert check["max_relative_regret"] > 100 * check["tie_bar"]
        assert check["metrics"]["logits"]["ok"]
