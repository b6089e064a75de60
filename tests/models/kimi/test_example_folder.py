"""``attnres example --arch kimi-linear`` writes transformers' own folder: we load it and compute transformers'
logits; it exports with past and ``attnres generate --onnx`` gives transformers' greedy tokens."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from attnres_export.models import load_checkpoint
from tests.cli.test_cli import invoke
from tests.models.kimi.lm_reference import relative_l2

LAYOUTS = {4: ("linear_attention",) * 3 + ("full_attention",), 2: ("linear_attention", "full_attention")}
"""Kimi-Linear-48B's layout: every fourth layer full attention; fewer than four layers end with one."""


@pytest.mark.parametrize(("layers", "block"), [(4, None), (2, 1)])
def test_the_cli_example_folder_loads_and_computes_transformers_logits(tmp_path, layers, block):
    args = ["example", "--arch", "kimi-linear", "--layers", str(layers), tmp_path / "f"]
    result = invoke(*args, *(["--block-size", str(block)] if block else []))
    assert result.exit_code == 0, result.output
    ours, _ = load_checkpoint(tmp_path / "f")
    assert ours.config.layer_types == LAYOUTS[layers]
    assert ours.config.attn_res_block_size == block
    if block is None:
        reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f", dtype=torch.float32).eval()
        tokens = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            assert relative_l2(ours(tokens), reference(tokens).logits) <= 1e-5


def test_an_example_with_one_layer_is_refused_in_one_line(tmp_path):
    result = invoke("example", "--arch", "kimi-linear", "--layers", "1", tmp_path / "f")
    assert result.exit_code == 1 and "needs >= 2 layers" in result.output


@pytest.mark.slow
def test_generate_on_the_with_past_onnx_gives_transformers_greedy_tokens(tmp_path):
    folder = tmp_path / "f"
    assert invoke("example", "--arch", "kimi-linear", "--layers", "4", "--seed", "5", folder).exit_code == 0
    onnx = tmp_path / "kimi.onnx"
    result = invoke("export", folder, "--with-past", "--target", "onnxruntime", "-o", onnx)
    assert result.exit_code == 0, result.output
    out = invoke("generate", folder, "--ids", "3,1,4,1,5", "--max-new-tokens", "32", "--onnx", onnx, "--json")
    assert out.exit_code == 0, out.output
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = reference.generate(torch.tensor([[3, 1, 4, 1, 5]]), max_new_tokens=32, do_sample=False,
                                      min_new_tokens=32)[0, 5:].tolist()
    assert json.loads(out.output.strip().splitlines()[-1])["tokens"] == expected
