"""Checkpoint folders (config.json + safetensors) load without unpickling everywhere a .pt loads: our own layout
written by `attnres convert-checkpoint` (single file and shards), and K3 AttnRes conventions on a Llama body
(checked against an independent K3-style implementation); unsupported models are refused in
one line."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from attnres_export.models import load_checkpoint
from tests.cli.test_cli import assert_one_line_error, invoke
from tests.conftest import slow_after, write_checkpoint


@pytest.mark.parametrize("shard_mb", slow_after([None, "0.01"]))
def test_converted_folder_loads_the_same_weights_and_logits_as_the_pt(tmp_path, shard_mb):
    ckpt = write_checkpoint(tmp_path / "m.pt", seed=6, n_layers=2, block_size=2)
    out = tmp_path / "folder"
    args = ["convert-checkpoint", ckpt, out] + (["--max-shard-mb", shard_mb] if shard_mb else [])
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert (out / ("model.safetensors.index.json" if shard_mb else "model.safetensors")).is_file()
    if shard_mb:
        assert len(list(out.glob("model-*-of-*.safetensors"))) > 1
    a, cfg_a = load_checkpoint(ckpt)
    b, cfg_b = load_checkpoint(out)
    assert cfg_a == cfg_b
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(a(ids), b(ids))


def test_convert_checkpoint_refuses_a_non_empty_output_folder(tmp_path):
    ckpt = write_checkpoint(tmp_path / "m.pt", n_layers=1)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    assert_one_line_error(invoke("convert-checkpoint", ckpt, tmp_path / "out"), "is not an empty folder")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["keep.txt"]


# --- K3 conventions, against an independent K3-style implementation -------------------------------------------

K3 = {"hidden_size": 32, "num_hidden_layers": 5, "num_attention_heads": 4, "intermediate_size": 48,
      "vocab_size": 61, "rms_norm_eps": 1e-5, "attn_res_block_size": 2, "max_position_embeddings": 64,
      "model_type": "llama", "rope_theta": 10000.0, "hidden_act": "silu"}


def k3_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]

    def rnd(*shape, std=None):
        return torch.randn(*shape, generator=g) * (std if std is not None else 1 / math.sqrt(shape[-1]))

    w = {"model.embed_tokens.weight": rnd(v, d, std=1.0), "model.norm.weight": 1 + 0.1 * rnd(d, std=1.0),
         "lm_head.weight": rnd(v, d), "model.output_attn_res_norm.weight": 1 + 0.1 * rnd(d, std=1.0),
         "model.output_attn_res_proj.weight": rnd(1, d, std=2 / math.sqrt(d))}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            w[p + f"self_attn.{name}.weight"] = rnd(d, d)
        w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = rnd(f, d), rnd(f, d)
        w[p + "mlp.down_proj.weight"] = rnd(d, f)
        for norm in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
            w[p + f"{norm}.weight"] = 1 + 0.1 * rnd(d, std=1.0)
        for proj in ("self_attention_res_proj", "mlp_res_proj"):
            w[p + f"{proj}.weight"] = rnd(1, d, std=2 / math.sqrt(d))
    return w


def k3_forward(w: dict[str, torch.Tensor], cfg: dict, ids: torch.Tensor) -> torch.Tensor:
    """K3's AttnRes loop written its own way: a block snapshot is taken at the start of every layer whose index is
    a multiple of attn_res_block_size; each site attends over the snapshots then the running partial sum, with
    logit = proj(RMSNorm(candidate)) (RMSNorm with the site's norm weight and rms_norm_eps)."""
    eps, heads = cfg["rms_norm_eps"], cfg["num_attention_heads"]
    d = cfg["hidden_size"]
    hd = d // heads

    def rms_norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def attn_res(prefix, blocks, proj, norm):
        candidates = torch.stack([*blocks, prefix])
        logits = (rms_norm(candidates, norm) @ proj.T).squeeze(-1)
        return (logits.softmax(0).unsqueeze(-1) * candidates).sum(0)

    t = ids.shape[1]
    inv = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos().float(), torch.cat([ang, ang], -1).sin().float()

    def rope(x):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def attention(x, p):
        b = x.shape[0]
        q, k, v = (F.linear(x, w[p + f"self_attn.{n}_proj.weight"]).view(b, t, heads, hd).transpose(1, 2)
                   for n in "qkv")
        out = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        return F.linear(out.transpose(1, 2).reshape(b, t, d), w[p + "self_attn.o_proj.weight"])

    def mlp(x, p):
        return F.linear(F.silu(F.linear(x, w[p + "mlp.gate_proj.weight"])) * F.linear(x, w[p + "mlp.up_proj.weight"]),
                        w[p + "mlp.down_proj.weight"])

    prefix, blocks = w["model.embed_tokens.weight"][ids], []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = attn_res(prefix, blocks, w[p + "self_attention_res_proj.weight"],
                     w[p + "self_attention_res_norm.weight"]) if blocks else prefix
        if i % cfg["attn_res_block_size"] == 0:
            blocks, prefix = [*blocks, prefix], None
        out = attention(rms_norm(x, w[p + "input_layernorm.weight"]), p)
        prefix = out if prefix is None else prefix + out
        x = attn_res(prefix, blocks, w[p + "mlp_res_proj.weight"], w[p + "mlp_res_norm.weight"])
        prefix = prefix + mlp(rms_norm(x, w[p + "post_attention_layernorm.weight"]), p)
    x = attn_res(prefix, blocks, w["model.output_attn_res_proj.weight"], w["model.output_attn_res_norm.weight"])
    return rms_norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def write_k3(folder, cfg: dict, weights: dict[str, torch.Tensor]):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(weights, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize(("layers", "block"), slow_after([(5, 2), (4, 1), (3, 3)]))
def test_k3_attnres_on_a_llama_body_equals_an_independent_k3_implementation(tmp_path, layers, block):
    cfg = K3 | {"num_hidden_layers": layers, "attn_res_block_size": block}
    weights = k3_weights(cfg, seed=layers * 10 + block)
    model, ours = load_checkpoint(write_k3(tmp_path / "k3", cfg, weights))
    assert ours.attn_res_block_size == block and ours.rms_norm_eps == cfg["rms_norm_eps"]
    ids = torch.randint(0, cfg["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(model(ids), k3_forward(weights, cfg, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("change", "message"), [
    ({"linear_attn_config": {"kda_layers": [1]}}, "linear_attn_config"),
    ({"num_experts": 8}, "num_experts"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "dynamic"),
    ({"attn_res_block_size": 0}, "attn_res_block_size: expected a whole number >= 1"),
])
def test_unsupported_k3_style_configs_are_refused_in_one_line(tmp_path, change, message):
    folder = write_k3(tmp_path / "k3", K3 | change, k3_weights(K3, 0))
    assert_one_line_error(invoke("generate", folder, "--ids", "1"), message)


def test_k3_style_weights_without_a_place_in_the_body_are_named(tmp_path):
    weights = k3_weights(K3, 0) | {"model.layers.0.self_attn.q_a_proj.weight": torch.zeros(4, 32)}
    folder = write_k3(tmp_path / "k3", K3, weights)
    assert_one_line_error(invoke("generate", folder, "--ids", "1"),
                          "unexpected model.layers.0.self_attn.q_a_proj.weight")


def test_folder_with_nan_weights_or_escaping_shards_is_refused(tmp_path):
    weights = k3_weights(K3, 0)
    weights["model.layers.1.mlp.up_proj.weight"][0, 0] = float("nan")
    assert_one_line_error(invoke("generate", write_k3(tmp_path / "nan", K3, weights), "--ids", "1"),
                          "model.safetensors: model.layers.1.mlp.up_proj.weight holds NaN or infinite values")
    folder = write_k3(tmp_path / "esc", K3, k3_weights(K3, 0))
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../x.safetensors"}}))
    assert_one_line_error(invoke("generate", folder, "--ids", "1"), "is not a file name inside the folder")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert_one_line_error(invoke("generate", tmp_path / "plain", "--ids", "1"),
                          "describes neither an attnres checkpoint")


def test_oversized_folder_config_is_refused_before_building(tmp_path):
    folder = write_k3(tmp_path / "k3", K3 | {"num_hidden_layers": 10**6}, k3_weights(K3, 0))
    assert_one_line_error(invoke("generate", folder, "--ids", "1"), "config says n_layers=1000000")


@pytest.mark.slow
def test_export_reads_a_checkpoint_folder_like_a_pt(tmp_path):
    ckpt = write_checkpoint(tmp_path / "m.pt", seed=6, n_layers=1, block_size=2)
    assert invoke("convert-checkpoint", ckpt, tmp_path / "folder").exit_code == 0
    result = invoke("export", tmp_path / "folder", "--seq", "1:4:8", "--report", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "folder.tensorrt.onnx").is_file()
    assert json.loads((tmp_path / "r.json").read_text())["ok"]
