"""Test helpers: tiny transformers models of every family written as Hugging Face folders, and the references
``DecoderLM`` is compared with.

The references are transformers itself: ``*ForCausalLM`` forwards and ``generate`` for the standard residual
stream, and for Attention Residuals ``k3_reference_logits``, which drives transformers' own layer modules
(``embed_tokens``, ``input_layernorm``, ``self_attn``, ``post_attention_layernorm``, ``mlp``, ``norm``,
``lm_head``) with the mixing of Kimi K3's reference code: NeMo AutoModel
``nemo_automodel/components/models/kimi_k3/model.py`` at commit 36044ad3d139363fb6c73c24af2e7c6b65ec52f6
(``KimiDecoderLayer._forward_attn_residual``, ``_apply_attn_res``, ``KimiK3TextModel._apply_output_attn_res``),
restated here in its own terms: scores ``proj(RMSNorm(v))`` of the candidates, a float32 softmax over them, the
float32 weighted sum of the un-normalized candidates rounded to the stream's type.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from attnres_export.models import base

TINY = {"vocab_size": 61, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "initializer_range": 0.1, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5}
MLA = {"num_key_value_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 6,
       "v_head_dim": 10, "first_k_dense_replace": 3, "n_routed_experts": 4, "n_group": 2, "topk_group": 1,
       "num_experts_per_tok": 2, "moe_intermediate_size": 16}
FAMILY_SETTINGS = {
    "llama": {},
    "qwen2": {},
    "qwen3": {"head_dim": 12},
    "qwen3_moe": {"head_dim": 12, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                  "mlp_only_layers": [0, 1, 2]},
    "deepseek_v3": MLA,
}
"""Tiny settings per family; every layer is dense (Qwen3-MoE through ``mlp_only_layers``, DeepSeek-V3 through
``first_k_dense_replace``), so these folders test attention, rope and the residual stream."""


def hf_model(family: str, seed: int, **overrides):
    """A transformers ``*ForCausalLM`` of ``family`` at random init, eager attention, in float32, with every
    1-D weight (norm gains, biases) moved off its init value so no check passes on ones and zeros."""
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = TINY | FAMILY_SETTINGS[family] | overrides
    cfg = AutoConfig.for_model(family, **settings)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def write_folder(model, path: Path, attn_res: dict[str, torch.Tensor] | None = None,
                 attn_res_block_size: int | None = None, config_edit=None) -> Path:
    """``model.save_pretrained(path)``, then the K3 AttnRes tensors and key added when given, and
    ``config_edit(config_dict)`` applied to config.json."""
    model.save_pretrained(path)
    if attn_res is not None:
        weights = path / "model.safetensors"
        save_file(load_file(str(weights)) | attn_res, str(weights), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    if attn_res_block_size is not None:
        config["attn_res_block_size"] = attn_res_block_size
    if config_edit is not None:
        config_edit(config)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def k3_site_weights(model, seed: int) -> dict[str, torch.Tensor]:
    """Random non-zero K3 site weights for every layer and the output: norm gains around 1, pseudo-queries
    ``[1, D]`` with standard deviation ``2 / sqrt(D)`` (so the depth softmax is far from a mean)."""
    d, layers = model.config.hidden_size, model.config.num_hidden_layers
    g = torch.Generator().manual_seed(seed)

    def pair(prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}_norm.weight": 1 + 0.3 * torch.randn(d, generator=g),
                f"{prefix}_proj.weight": 2 / d**0.5 * torch.randn(1, d, generator=g)}

    out = pair("model.output_attn_res")
    for i in range(layers):
        out |= pair(f"model.layers.{i}.self_attention_res") | pair(f"model.layers.{i}.mlp_res")
    return out


def additive_mask(attention_mask: torch.Tensor, query_len: int) -> torch.Tensor:
    """transformers' eager mask for one forward over all ``S`` tokens: ``[B, 1, T, S]``, 0 where allowed,
    float32's lowest value elsewhere (causal and padding)."""
    s = attention_mask.shape[1]
    query_pos = torch.arange(s - query_len, s)
    allowed = (torch.arange(s)[None, :] <= query_pos[:, None])[None, None] & attention_mask[:, None, None, :].bool()
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)


def k3_reference_logits(model, site: dict[str, torch.Tensor], block: int, input_ids: torch.Tensor,
                        attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
                        ) -> torch.Tensor:
    """Logits of Kimi K3's Attention Residuals around transformers' layer modules of ``model`` (see the module
    docstring): per layer, the attention input mixes the bank of block snapshots and the running partial sum
    (layer 0: the embedding itself); a layer whose index is a multiple of ``block`` then snapshots the running sum
    into the bank and restarts it; the MLP input mixes the bank and the partial sum; the output mixes them once
    more before the final norm."""
    body = model.model
    b, t = input_ids.shape
    attention_mask = torch.ones(b, t, dtype=torch.int64) if attention_mask is None else attention_mask
    position_ids = torch.arange(t)[None].expand(b, t) if position_ids is None else position_ids
    eps = model.config.rms_norm_eps
    h = body.embed_tokens(input_ids)
    rope = body.rotary_emb(h, position_ids)
    mask = additive_mask(attention_mask, t)

    def mix(prefix: str, values: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack(values, dim=-2).float()
        normed = site[f"{prefix}_norm.weight"].float() * stacked * torch.rsqrt(stacked.pow(2).mean(-1, keepdim=True)
                                                                               + eps)
        scores = normed @ site[f"{prefix}_proj.weight"].float().T
        weights = scores.softmax(dim=-2)
        return (weights * stacked).sum(dim=-2).to(values[0].dtype)

    bank: list[torch.Tensor] = []
    partial: torch.Tensor | None = h
    for i, layer in enumerate(body.layers):
        name = f"model.layers.{i}"
        x = mix(f"{name}.self_attention_res", [*bank, partial]) if bank else partial
        if i % block == 0:
            bank.append(partial)
            partial = None
        out = layer.self_attn(layer.input_layernorm(x), position_embeddings=rope, attention_mask=mask)[0]
        partial = out if partial is None else partial + out
        x = mix(f"{name}.mlp_res", [*bank, partial])
        partial = partial + layer.mlp(layer.post_attention_layernorm(x))
    x = mix("model.output_attn_res", [*bank, partial])
    return model.lm_head(body.norm(x)).float()


def left_padded(ids: torch.Tensor, pads: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, position_ids)`` of ``ids`` with row ``r`` left-padded by ``pads[r]`` (pad id
    0), positions counted from each row's first token as transformers' ``generate`` counts them."""
    ids = ids.clone()
    mask = torch.ones_like(ids)
    for r, p in enumerate(pads):
        ids[r, :p] = 0
        mask[r, :p] = 0
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    return ids, mask, positions


def relative_l2(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours.double() - reference.double()).norm() / reference.double().norm()).item()


def empty_past(lm, batch: int) -> list[torch.Tensor]:
    """The cache of a ``DecoderLM`` before its first token, in its weights' type."""
    return base.empty_past(lm.with_past().cache_inputs(), batch, lm.lm_head.weight.dtype)


def greedy_with_past(lm, ids: torch.Tensor, mask: torch.Tensor, steps: int) -> torch.Tensor:
    """``steps`` greedy tokens ``[B, steps]`` from the with-past form: one prefill over the (left-padded) prompt,
    then one decode step per token, each row's positions continuing its own count."""
    step = lm.with_past()
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    out = step(ids, mask, positions, empty_past(lm, ids.shape[0]))
    tokens = []
    for _ in range(steps):
        token = out[0][:, -1].argmax(-1, keepdim=True)
        tokens.append(token)
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        positions = positions[:, -1:] + 1
        out = step(token, mask, positions, list(out[1:]))
    return torch.cat(tokens, dim=1)
