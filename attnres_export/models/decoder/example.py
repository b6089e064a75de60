"""Tiny random Hugging Face folders of each decoder family (``attnres example --arch llama OUT_DIR``).

A folder is what transformers' ``save_pretrained`` writes for that family: ``config.json`` in transformers' keys
and ``model.safetensors`` in its weight names, so transformers itself loads it. With ``attn_res_block_size`` the
folder carries Kimi K3's Attention Residuals keys and weights (random, non-zero pseudo-queries).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from attnres_export.atomic import default_file_mode, temporary_dir_beside
from attnres_export.errors import CheckpointError

COMMON = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
          "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
          "bos_token_id": 1, "eos_token_id": 2}
FAMILY_EXTRAS: dict[str, dict] = {
    "llama": {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
    "qwen2": {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "tie_word_embeddings": True},
    "qwen3": {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
    "qwen3_moe": {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "num_experts": 8,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
                  "decoder_sparse_step": 1, "mlp_only_layers": []},
    "deepseek_v3": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "num_key_value_heads": 4,
                    "head_dim": 8,
                    "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                    "v_head_dim": 16, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                    "n_shared_experts": 1, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
                    "first_k_dense_replace": 1, "norm_topk_prob": True},
}
"""Per family, what its tiny example adds to ``COMMON`` (DeepSeek-V3: latent attention, grouped routing, one dense
layer first; Qwen2: tied embeddings)."""


def example_config(model_type: str, attn_res_block_size: int | None = None, layers: int | None = None) -> dict:
    """The ``config.json`` of a tiny ``model_type`` model."""
    if model_type not in FAMILY_EXTRAS:
        raise CheckpointError(f"no example of model_type {model_type!r}; choose one of {', '.join(FAMILY_EXTRAS)}")
    config = {"model_type": model_type, **COMMON, **FAMILY_EXTRAS[model_type]}
    if layers is not None:
        config["num_hidden_layers"] = layers
    if attn_res_block_size is not None:
        config["attn_res_block_size"] = attn_res_block_size
    return config


def write_example_folder(model_type: str, out_dir: Path, seed: int = 0, attn_res_block_size: int | None = None,
                         layers: int | None = None) -> tuple[Path, dict, int]:
    """Write the folder (atomically: built beside ``out_dir``, renamed into place); returns it, its config and
    the parameter count."""
    from safetensors.torch import save_file

    from attnres_export.models.decoder.hf_config import parse_hf_config
    from attnres_export.models.example import make_example

    out_dir = Path(out_dir)
    if out_dir.exists():
        raise CheckpointError(f"{out_dir} exists; choose a new output folder")
    config = example_config(model_type, attn_res_block_size, layers)
    model = make_example(parse_hf_config(config, where="example config"), seed)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight")
    with temporary_dir_beside(out_dir) as tmp:
        folder = tmp / "out"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"architectures": [_architecture(model_type)], **config},
                                                       indent=2) + "\n")
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        for file in folder.iterdir():
            file.chmod(default_file_mode())  # safetensors writes 0600; every file reads like config.json (umask)
        os.replace(folder, out_dir)
    return out_dir, config, sum(p.numel() for p in model.parameters())


def _architecture(model_type: str) -> str:
    return {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "qwen3_moe": "Qwen3MoeForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}[model_type]

