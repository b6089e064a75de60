"""transformers 5.23's ``KimiLinearForCausalLM`` at random init written as a folder, and Kimi K3's Attention
Residuals mixing driven around transformers' own Kimi Linear layer modules (the mixing restated from NeMo
AutoModel's Kimi K3 code, as ``tests/models/decoder/hf_bodies.py`` does for the decoder families): the independent
references of the Kimi Linear tests."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import KimiLinearConfig, KimiLinearForCausalLM

from tests.models.decoder.hf_bodies import additive_mask, k3_site_weights, write_folder

TINY = {"vocab_size": 61, "hidden_size": 32, "intermediate_size": 40, "moe_intermediate_size": 16,
        "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 2, "kv_lora_rank": 12,
        "q_lora_rank": None, "qk_rope_head_dim": 6, "qk_nope_head_dim": 8, "v_head_dim": 10, "num_local_experts": 4,
        "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 256, "initializer_range": 0.1,
        "linear_attn_config": {"head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 4, "kda_layers": [1, 3],
                               "full_attn_layers": [2, 4]},
        "mlp_layer_types": ["dense", "sparse", "dense", "sparse"], "pad_token_id": 0, "bos_token_id": 1,
        "eos_token_id": 2}
"""KDA and latent attention interleaved, two MoE layers; transformers' KDA prefill runs chunks of 64."""


def hf_model(seed: int, **overrides) -> KimiLinearForCausalLM:
    """transformers' model at its own random init, with random expert score-correction biases (zero ones leave
    the selection bias untested)."""
    torch.manual_seed(seed)
    model = KimiLinearForCausalLM(KimiLinearConfig(**(TINY | overrides))).eval()
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.05)
    return model


def folder_of(model: KimiLinearForCausalLM, path: Path, attn_res_block_size: int | None = None,
              seed: int = 0) -> tuple[Path, dict[str, torch.Tensor] | None]:
    """``model.save_pretrained(path)``, with K3 site weights and ``attn_res_block_size`` added when given."""
    sites = None if attn_res_block_size is None else k3_site_weights(model, seed)
    return write_folder(model, path, sites, attn_res_block_size), sites


def k3_kimi_reference_logits(model: KimiLinearForCausalLM, site: dict[str, torch.Tensor], block: int,
                             input_ids: torch.Tensor) -> torch.Tensor:
    """K3's mixing around transformers' Kimi Linear layers: the bank of block snapshots and the running partial
    sum mixed before each sublayer's PreNorm and once more before the final norm (tests/models/decoder/hf_bodies.py
    ``k3_reference_logits`` for the steps); KDA layers called without a mask, latent attention with the causal one."""
    body = model.model
    t = input_ids.shape[1]
    mask = additive_mask(torch.ones(input_ids.shape, dtype=torch.int64), t)
    eps = model.config.rms_norm_eps

    def mix(prefix: str, values: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack(values, dim=-2).float()
        normed = site[f"{prefix}_norm.weight"] * stacked * torch.rsqrt(stacked.pow(2).mean(-1, keepdim=True) + eps)
        weights = (normed @ site[f"{prefix}_proj.weight"].T).softmax(dim=-2)
        return (weights * stacked).sum(dim=-2).to(values[0].dtype)

    h = body.embed_tokens(input_ids)
    bank: list[torch.Tensor] = []
    partial: torch.Tensor | None = h
    for i, layer in enumerate(body.layers):
        name = f"model.layers.{i}"
        x = mix(f"{name}.self_attention_res", [*bank, partial]) if bank else partial
        if i % block == 0:
            bank.append(partial)
            partial = None
        normed = layer.input_layernorm(x)
        if model.config.layer_types[i] == "linear_attention":
            out = layer.self_attn(hidden_states=normed)
        else:
            out = layer.self_attn(hidden_states=normed, attention_mask=mask)[0]
        partial = out if partial is None else partial + out
        x = mix(f"{name}.mlp_res", [*bank, partial])
        partial = partial + layer.mlp(layer.post_attention_layernorm(x))
    x = mix("model.output_attn_res", [*bank, partial])
    return model.lm_head(body.norm(x)).float()


def relative_l2(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours.double() - reference.double()).norm() / reference.double().norm())
