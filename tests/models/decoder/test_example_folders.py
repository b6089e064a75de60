"""``attnres example --arch FAMILY`` writes real Hugging Face folders: transformers itself loads each one and computes
the logits we compute; the folder exports (with past) and ``attnres generate --onnx`` gives transformers' greedy
tokens."""

from __future__ import annotations

import json

import pytest
import torch

from attnres_export.models import load_checkpoint
from attnres_export.models.decoder.example import FAMILY_EXTRAS, write_example_folder
from tests.cli.test_cli import invoke
from tests.conftest import slow_after

transformers = pytest.importorskip("transformers")
FAMILIES = slow_after(list(FAMILY_EXTRAS))


def relative_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_transformers_loads_the_example_folder_and_computes_our_logits(tmp_path, family):
    folder, _, _ = write_example_folder(family, tmp_path / family, seed=3)
    ours, _ = load_checkpoint(folder)
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for shape in ((1, 1), (2, 7), (3, 19)):
        ids = torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(sum(shape)))
        assert relative_l2(ours(ids), reference(ids).logits) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_generate_on_the_with_past_onnx_gives_transformers_greedy_tokens(tmp_path, family):
    folder, _, _ = write_example_folder(family, tmp_path / family, seed=5)
    onnx = tmp_path / f"{family}.onnx"
    result = invoke("export", folder, "--with-past", "--target", "onnxruntime", "-o", onnx)
    assert result.exit_code == 0, result.output
    out = invoke("generate", folder, "--ids", "3,1,4,1,5", "--max-new-tokens", "32", "--onnx", onnx, "--json")
    assert out.exit_code == 0, out.output
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = reference.generate(torch.tensor([[3, 1, 4, 1, 5]]), max_new_tokens=32, do_sample=False,
                                      min_new_tokens=32)[0, 5:].tolist()
    assert json.loads(out.output.strip().splitlines()[-1])["tokens"] == expected


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3"])
def test_an_attnres_example_exports_one_node_per_aggregation_and_passes_parity(tmp_path, family):
    folder, _, _ = write_example_folder(family, tmp_path / family, seed=7, attn_res_block_size=1)
    report = tmp_path / "r.json"
    result = invoke("export", folder, "-o", tmp_path / "m.onnx", "--report", report, "--seq", "1:8:16")
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["ok"] and data["fused_nodes"] == 2 * 2
