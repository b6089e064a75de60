"""Reading a Kimi Linear Hugging Face folder (``model_type`` ``kimi_linear``), the registry's ``hf_reader``.

transformers 5.23 saves (and Moonshot ships) each feed-forward under ``block_sparse_moe.`` and each routed expert
as ``experts.{j}.w1`` (gate), ``w3`` (up), ``w2`` (down); the model holds them as ``mlp.`` with the experts stacked
(``decoder/moe.py``). The KDA and latent-attention tensors load under their saved names. ``lm_head.weight`` is
always the folder's own: transformers 5.23's ``KimiLinearForCausalLM`` ties nothing (``_tied_weights_keys = {}``)
whatever ``tie_word_embeddings`` says.
"""

from __future__ import annotations

import re

import torch

from attnres_export.models.decoder.moe import expert_state_from_hf
from attnres_export.models.kimi.lm_config import KimiLinearConfig

_SAVED_FFN = re.compile(r"(model\.layers\.\d+\.)block_sparse_moe\.")
_SAVED_EXPERT = re.compile(r"(experts\.\d+\.)(w1|w2|w3)\.weight$")
_EXPERT_NAMES = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}


def read_hf(config: dict, tensors: dict[str, torch.Tensor], where: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(our config dict, state_dict)`` of a folder's ``config.json`` and tensors."""
    cfg = KimiLinearConfig.from_hf(config, where=f"{where}/config.json")
    state = {_our_name(name): tensor for name, tensor in tensors.items()}
    for index in range(cfg.num_hidden_layers):
        if cfg.is_moe_layer(index):
            prefix = f"model.layers.{index}.mlp."
            block = expert_state_from_hf(prefix, state)
            state = {k: v for k, v in state.items() if not k.startswith(prefix)} | {
                prefix + name: tensor for name, tensor in block.items()}
    return cfg.to_dict(), state


def _our_name(name: str) -> str:
    name = _SAVED_FFN.sub(r"\1mlp.", name)
    return _SAVED_EXPERT.sub(lambda m: f"{m[1]}{_EXPERT_NAMES[m[2]]}.weight", name)
