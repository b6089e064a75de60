"""A Kimi K3 folder as Moonshot publishes it (``attnres example --arch kimi-k3``) loads, leaving the vision tensors
out in one line, and computes the independent float64 K3 reference (SiTU, latent MoE, MLA output gate, full-rank
KDA gate, lower-bounded forget gate, a partial last AttnRes block); its with-past ONNX generates the reference's
greedy tokens. K3 keys attnres does not compute are refused in one line naming them."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextForgetGate

from attnres_export.errors import CheckpointError
from attnres_export.models import load_checkpoint
from attnres_export.models.kimi import KdaConfig, KimiDeltaAttention
from attnres_export.models.kimi.k3_example import write_k3_example_folder
from tests.cli.test_cli import invoke
from tests.models.kimi.k3_reference import K3Reference
from tests.models.kimi.lm_reference import relative_l2


def k3_folder(path, layers=7, block=3, **text_changes):
    """The example folder, with the SiTU betas small enough that both tanh clips bite at random init."""
    folder, _, _ = write_k3_example_folder(path, seed=3, attn_res_block_size=block, layers=layers)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"] |= {"activation_situ_beta": 0.05, "activation_situ_linear_beta": 0.1} | text_changes
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_vision_tower_left_out_is_said_once_however_often_the_folder_is_read(tmp_path, caplog):
    folder = k3_folder(tmp_path / "k3", layers=3)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            load_checkpoint(folder)
    assert caplog.text.count("left out 2 vision-tower") == 1


@pytest.mark.parametrize("tokens", [[7], [3, 1, 4, 1, 5, 9, 2, 6, 5]])
@torch.inference_mode()
def test_k3_folder_logits_match_the_float64_reference_written_from_the_k3_sources(tmp_path, caplog, tokens):
    folder = k3_folder(tmp_path / "k3")
    with caplog.at_level(logging.WARNING):
        ours, cfg = load_checkpoint(folder)
    assert [r.getMessage().count("\n") for r in caplog.records] == [0]
    assert "left out 2 vision-tower and projector tensors" in caplog.text
    assert cfg.layer_types.count("full_attention") == 2 and cfg.attn_res_block_size == 3
    reference = K3Reference(folder).logits(tokens)
    assert relative_l2(ours.eval()(torch.tensor([tokens]))[0], reference) <= 1e-5


@torch.inference_mode()
def test_the_lower_bounded_forget_gate_is_transformers_glm5_next_safe_gate():
    config = Glm5NextTextConfig(hidden_size=24, linear_head_dim=8, linear_num_heads=3, linear_lower_bound=-5.0)
    reference = Glm5NextTextForgetGate(config)
    ours = KimiDeltaAttention(KdaConfig(24, 3, 8, 4, 1e-5, ("linear_attention",), gate_lower_bound=-5.0))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in reference.parameters():
            param.copy_(torch.randn(param.shape, generator=gen))
        for name in ("f_a_proj", "f_b_proj"):
            getattr(ours, name).weight.copy_(getattr(reference, name).weight)
        ours.dt_bias.copy_(reference.dt_bias)
        ours.A_log.copy_(reference.A_log.view(1, 1, 3, 1))
    for shape in ((1, 1, 24), (2, 5, 24)):
        x = torch.randn(shape, generator=gen)
        assert relative_l2(ours._log_decay(x), reference(x)) <= 1e-6


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c["text_config"].pop("quantization_config"), "a quantized weight's part, but config.json has no "
                                                             "quantization_config"),
    (lambda c: c.update(hidden_size=64), "top-level key hidden_size of a kimi_k3 folder not implemented"),
    (lambda c: c["text_config"].update(hidden_act="gelu"), "hidden_act 'gelu' is not implemented"),
    (lambda c: c["text_config"].update(latent_moe_use_norm=True, routed_expert_hidden_size=None),
     "latent_moe_use_norm is true but routed_expert_hidden_size is null"),
])
def test_k3_settings_attnres_does_not_compute_are_refused_in_one_line(tmp_path, edit, message):
    folder, _, _ = write_k3_example_folder(tmp_path / "k3", seed=0, attn_res_block_size=None, layers=2)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message) as info:
        load_checkpoint(folder)
    assert "\n" not in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("block", [None, 3])
@torch.inference_mode()
def test_k3_without_attn_res_and_with_past_steps_match_the_reference(tmp_path, block):
    folder = k3_folder(tmp_path / "k3", block=block)
    ours, _ = load_checkpoint(folder)
    tokens = [5, 3, 8, 1, 9, 2, 7]
    assert relative_l2(ours.eval()(torch.tensor([tokens]))[0], K3Reference(folder).logits(tokens)) <= 1e-5
    wrapper = ours.with_past()
    from attnres_export.models.base import empty_past

    out = wrapper(torch.tensor([tokens[:4]]), torch.ones(1, 4, dtype=torch.int64), torch.arange(4)[None],
                  empty_past(wrapper.cache_inputs(), 1))
    logits, past = [out[0]], list(out[1:])
    for i in range(4, len(tokens)):
        out = wrapper(torch.tensor([[tokens[i]]]), torch.ones(1, i + 1, dtype=torch.int64), torch.full((1, 1), i),
                      past)
        logits.append(out[0])
        past = list(out[1:])
    assert relative_l2(torch.cat(logits, dim=1), ours(torch.tensor([tokens]))) <= 1e-5


@pytest.mark.slow
def test_k3_generate_on_the_with_past_onnx_gives_the_reference_greedy_tokens(tmp_path):
    folder = k3_folder(tmp_path / "k3")
    onnx = tmp_path / "k3.onnx"
    result = invoke("export", folder, "--with-past", "--target", "onnxruntime", "-o", onnx)
    assert result.exit_code == 0, result.output
    assert "left out 2 vision-tower" in result.output or "parity" in result.output.lower()
    out = invoke("generate", folder, "--ids", "3,1,4,1,5", "--max-new-tokens", "32", "--onnx", onnx, "--json")
    assert out.exit_code == 0, out.output
    expected = K3Reference(folder).greedy([3, 1, 4, 1, 5], 32)
    assert json.loads(out.output.strip().splitlines()[-1])["tokens"] == expected
