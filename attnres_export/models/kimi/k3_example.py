"""A tiny random Kimi K3 folder (``attnres example --arch kimi-k3 OUT_DIR``) in the layout Moonshot publishes
(docs/models.md#kimi-k3): ``KimiK3ForConditionalGeneration`` with the text model's config under ``text_config``,
its tensors under ``language_model.`` with the published names (``block_sparse_moe.experts.{j}.w1/w2/w3``, a 1-D
``A_log`` of ``head_dim`` values), the routed experts in MXFP4 (compressed-tensors ``mxfp4-pack-quantized``, its
config under ``text_config.quantization_config``), and small ``vision_tower.*`` / ``mm_projector.*`` tensors beside
them.

transformers has no K3 model, so the weights are our model's ``init_example`` ones written under those names;
K3's additions are all on: SiTU with K3's betas, the latent MoE with its norm, the MLA output gate, the full-rank
KDA gate and the forget-gate lower bound. Layers are laid out as K3's ``full_attn_layers`` [4, 8, ..., 92, 93]
are: every fourth (1-based) and the last full attention, the rest KDA.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from attnres_export.atomic import default_file_mode, temporary_dir_beside
from attnres_export.errors import CheckpointError

K3_MODEL_TYPE = "kimi_k3"
TEXT = {
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
    "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 32, "q_lora_rank": 24,
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "num_experts": 8, "num_experts_per_token": 2,
    "num_expert_group": 1, "topk_group": 1, "num_shared_experts": 2, "routed_scaling_factor": 2.446,
    "moe_renormalize": True, "moe_router_activation_func": "sigmoid", "use_grouped_topk": True,
    "topk_method": "noaux_tc", "moe_layer_freq": 1, "first_k_dense_replace": 1, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 512, "mla_use_nope": True, "mla_use_output_gate": True, "hidden_act": "situ",
    "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0, "routed_expert_hidden_size": 32,
    "latent_moe_use_norm": True, "num_nextn_predict_layers": 0, "tie_word_embeddings": False,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
}
"""Kimi K3's text_config keys (moonshotai/Kimi-K3, as SGLang's and llama.cpp's K3 code read them) at tiny sizes;
the latent width is half the hidden size, as K3's 3584 of 7168."""
KDA = {"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4, "use_full_rank_gate": True,
       "gate_lower_bound": -5.0}
VISION = {"vt_hidden_size": 16, "vt_num_hidden_layers": 1, "patch_size": 14, "text_hidden_size": 64}
QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"], "input_activations": None, "output_activations": None,
        "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32, "symmetric": True,
                    "dynamic": False, "observer": "minmax", "scale_dtype": "torch.uint8"}}},
    "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
               "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"],
}
"""Kimi K3's ``text_config.quantization_config`` (docs/quantization.md, review §1.3): compressed-tensors MXFP4
weights only, packed for the routed experts alone (review §1.4)."""
_ROUTED_EXPERT = re.compile(r"block_sparse_moe\.experts\.\d+\.w[123]\.weight$")
_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_SAVED_EXPERTS = re.compile(r"(model\.layers\.\d+\.)mlp\.experts\.(gate_up_proj|down_proj)$")


def k3_text_config(layers: int, attn_res_block_size: int | None) -> dict:
    if layers < 2:
        raise CheckpointError(f"--layers {layers}: a Kimi K3 example needs >= 2 layers (KDA and latent attention)")
    full = sorted({n for n in range(1, layers + 1) if n % 4 == 0} | {layers})
    return {**TEXT, "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"],
            "num_hidden_layers": layers, "attn_res_block_size": attn_res_block_size,
            "linear_attn_config": {**KDA, "kda_layers": [n for n in range(1, layers + 1) if n not in full],
                                   "full_attn_layers": full}}


def write_k3_example_folder(out_dir: Path, seed: int, attn_res_block_size: int | None, layers: int
                            ) -> tuple[Path, dict, int]:
    """Write the folder atomically; returns it, its config and the text model's parameter count."""
    import torch
    from safetensors.torch import save_file

    from attnres_export.models.kimi.lm_config import KimiLinearConfig
    from attnres_export.models.kimi.model import KimiLinearLM
    from attnres_export.models.store.quantized import mxfp4

    text = k3_text_config(layers, attn_res_block_size)
    torch.manual_seed(seed)
    model = KimiLinearLM(KimiLinearConfig.from_hf(text)).eval()
    model.init_example()
    tensors = {}
    for name, tensor in _published(model).items():
        if _ROUTED_EXPERT.search(name):
            tensors |= {f"language_model.{name.removesuffix('weight')}{part}": value
                        for part, value in mxfp4.pack(tensor).items()}
        else:
            tensors[f"language_model.{name}"] = tensor
    text = {**text, "quantization_config": QUANTIZATION_CONFIG}
    tensors["vision_tower.patch_embed.proj.weight"] = torch.randn(VISION["vt_hidden_size"], 3, 14, 14) * 0.02
    tensors["mm_projector.proj.0.weight"] = torch.randn(TEXT["hidden_size"], VISION["vt_hidden_size"] * 4) * 0.02
    config = {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": K3_MODEL_TYPE,
              "text_config": text, "vision_config": VISION, "media_placeholder_token_id": 255, "pad_token_id": 0}
    with temporary_dir_beside(out_dir) as tmp:
        folder = tmp / "out"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"),
                  metadata={"format": "pt"})
        for file in folder.iterdir():
            file.chmod(default_file_mode())
        os.replace(folder, out_dir)
    return out_dir, config, sum(p.numel() for p in model.parameters())


def _published(model) -> dict:
    """Our state_dict under K3's published names."""
    import torch

    heads, head_dim = model.config.kda.num_heads, model.config.kda.head_dim
    out = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().clone()
        stacked = _SAVED_EXPERTS.match(name)
        if stacked:
            layer = stacked[1] + "block_sparse_moe.experts."
            for j, expert in enumerate(tensor):
                if stacked[2] == "down_proj":
                    out[f"{layer}{j}.w2.weight"] = expert
                else:
                    gate, up = expert.chunk(2, dim=0)
                    out[f"{layer}{j}.w1.weight"], out[f"{layer}{j}.w3.weight"] = gate, up
            continue
        if name.endswith("self_attn.A_log"):
            tensor = torch.cat([tensor.reshape(heads), torch.randn(head_dim - heads)])
        layer_index = _LAYER.match(name)
        if ".mlp." in name and layer_index and model.config.is_moe_layer(int(layer_index[1])):
            name = name.replace(".mlp.", ".block_sparse_moe.")
        out[name] = tensor
    return out
