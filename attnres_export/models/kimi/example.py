"""A tiny random Kimi Linear folder (``attnres example --arch kimi-linear OUT_DIR``): written by transformers'
own ``KimiLinearForCausalLM.save_pretrained``, so the folder is exactly what transformers saves and loads (KDA
and latent attention interleaved as the published config lists them, dense and MoE feed-forwards)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from attnres_export.atomic import default_file_mode, temporary_dir_beside
from attnres_export.errors import CheckpointError
from attnres_export.models.kimi.k3_example import K3_MODEL_TYPE, write_k3_example_folder

EXAMPLE_CONFIG = {
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
    "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 32,
    "q_lora_rank": None, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "num_local_experts": 8,
    "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "n_shared_experts": 1, "routed_scaling_factor": 2.446,
    "norm_topk_prob": True, "rms_norm_eps": 1e-5, "max_position_embeddings": 512,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
}
"""Kimi-Linear-48B's sizes in miniature: grouped sigmoid routing with a shared expert."""
KDA = {"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4}


def example_config(layers: int = 4, attn_res_block_size: int | None = None) -> dict:
    """The ``config.json`` keys of a tiny ``layers``-layer model laid out as Kimi-Linear-48B is: every fourth layer
    (1-based) full attention, the rest KDA (with fewer than four layers the last one is full attention, so both
    kinds are present), the first feed-forward dense and the rest MoE."""
    if layers < 2:
        raise CheckpointError(f"--layers {layers}: a Kimi Linear example needs >= 2 layers (KDA and latent attention)")
    full = [n for n in range(1, layers + 1) if n % 4 == 0] or [layers]
    config = {**EXAMPLE_CONFIG, "num_hidden_layers": layers,
              "linear_attn_config": {**KDA, "kda_layers": [n for n in range(1, layers + 1) if n not in full],
                                     "full_attn_layers": full},
              "mlp_layer_types": ["dense"] + ["sparse"] * (layers - 1)}
    if attn_res_block_size is not None:
        config["attn_res_block_size"] = attn_res_block_size
    return config


def write_example_folder(model_type: str, out_dir: Path, seed: int = 0, attn_res_block_size: int | None = None,
                         layers: int | None = None) -> tuple[Path, dict, int]:
    """Write the folder atomically; returns it, its config and the parameter count."""
    import torch
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    if model_type not in ("kimi_linear", K3_MODEL_TYPE):
        raise CheckpointError(f"no kimi-linear example of model_type {model_type!r}; use kimi_linear or kimi_k3")
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise CheckpointError(f"{out_dir} exists; choose a new output folder")
    if model_type == K3_MODEL_TYPE:
        return write_k3_example_folder(out_dir, seed, attn_res_block_size, 7 if layers is None else layers)
    config = example_config(4 if layers is None else layers, attn_res_block_size)
    torch.manual_seed(seed)
    hf_keys = {k: v for k, v in config.items() if k != "attn_res_block_size"}
    model = KimiLinearForCausalLM(KimiLinearConfig(**hf_keys)).eval()
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.02)
    with temporary_dir_beside(out_dir) as tmp:
        folder = tmp / "out"
        model.save_pretrained(folder)
        if attn_res_block_size is not None:
            _add_attn_res(folder, config)
        for file in folder.iterdir():
            file.chmod(default_file_mode())
        os.replace(folder, out_dir)
    return out_dir, {"model_type": "kimi_linear", **config}, sum(p.numel() for p in model.parameters())


def _add_attn_res(folder: Path, config: dict) -> None:
    """Kimi K3's Attention Residuals key and site weights (norm gains near 1, pseudo-queries of std ``2/sqrt(D)``)
    added to a saved folder."""
    import torch
    from safetensors.torch import load_file, save_file

    d = config["hidden_size"]

    def pair(prefix: str) -> dict:
        return {f"{prefix}_norm.weight": 1 + 0.1 * torch.randn(d),
                f"{prefix}_proj.weight": 2 / d**0.5 * torch.randn(1, d)}

    sites = pair("model.output_attn_res")
    for i in range(config["num_hidden_layers"]):
        sites |= pair(f"model.layers.{i}.self_attention_res") | pair(f"model.layers.{i}.mlp_res")
    weights = folder / "model.safetensors"
    save_file(load_file(str(weights)) | sites, str(weights), metadata={"format": "pt"})
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(saved | {"attn_res_block_size": config["attn_res_block_size"]},
                                                   indent=2) + "\n")
