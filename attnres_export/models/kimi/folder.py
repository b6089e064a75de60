"""Reading a Kimi Linear Hugging Face folder (``model_type`` ``kimi_linear``) or a Kimi K3 folder (``kimi_k3``),
the registry's ``hf_reader``.

A K3 folder (``KimiK3ForConditionalGeneration``) nests the text model's config under ``text_config`` and its
tensors under ``language_model.`` beside ``vision_tower.*`` and ``mm_projector.*`` (SGLang ``kimi_k3.py``
``load_weights``, llama.cpp ``conversion/kimi_k3.py`` ``get_tensors``): the text model is read, the vision tensors
are left out with one warning line. K3 ships each KDA layer's ``A_log`` as a 1-D ``[head_dim]`` tensor of which the
first ``num_heads`` values are the heads' decay rates (both engines narrow it so); it is read as ``[1, 1, H, 1]``.

transformers 5.23 saves (and Moonshot ships) each feed-forward under ``block_sparse_moe.`` and each routed expert
as ``experts.{j}.w1`` (gate), ``w3`` (up), ``w2`` (down); the model holds them as ``mlp.`` with the experts stacked
(``layers/moe.py``). The KDA and latent-attention tensors load under their saved names. ``lm_head.weight`` is
always the folder's own: transformers 5.23's ``KimiLinearForCausalLM`` ties nothing (``_tied_weights_keys = {}``)
whatever ``tie_word_embeddings`` says.
"""

from __future__ import annotations

import logging
import re

import torch

from attnres_export.errors import CheckpointError
from attnres_export.models.kimi.lm_config import KimiLinearConfig
from attnres_export.models.kimi.model import KimiLinearLM
from attnres_export.models.layers.moe import expert_state_from_hf
from attnres_export.models.limits import layer_indices
from attnres_export.models.store.tensors import StoredTensor

K3_MODEL_TYPE = "kimi_k3"
TEXT_PREFIX = "language_model."
VISION_PREFIXES = ("vision_tower.", "mm_projector.")
K3_WRAPPER_KEYS = frozenset({"architectures", "model_type", "text_config", "vision_config", "auto_map",
                             "transformers_version", "torch_dtype", "dtype", "ignore_index", "image_placeholder",
                             "media_placeholder_token_id", "pad_token_id", "bos_token_id", "eos_token_id",
                             "tie_word_embeddings", "use_cache", "_name_or_path", "quantization_config"})
"""Top-level keys of a K3 folder: bookkeeping, the two sub-configs and the image placeholder (SGLang
``configs/kimi_k3.py``); ``quantization_config`` here is read as the text model's."""
_LATENT = re.compile(r"(model\.layers\.\d+\.mlp\.)(routed_expert_(?:down_proj|up_proj|norm)\.weight)$")
_A_LOG = re.compile(r"model\.layers\.(\d+)\.self_attn\.A_log$")
log = logging.getLogger(__name__)

_SAVED_FFN = re.compile(r"(model\.layers\.\d+\.)block_sparse_moe\.")
_SAVED_EXPERT = re.compile(r"(experts\.\d+\.)(w1|w2|w3)\.weight$")
_EXPERT_NAMES = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}


def read_hf(config: dict, tensors: dict[str, StoredTensor], where: str
            ) -> tuple[KimiLinearConfig, dict[str, StoredTensor]]:
    """``(config, state_dict)`` of a folder's ``config.json`` and its tensors (``models/store``: nothing is read
    here)."""
    if config.get("model_type") == K3_MODEL_TYPE:
        config, tensors = _k3_text_model(config, tensors, where)
    cfg = KimiLinearConfig.from_hf(config, where=f"{where}/config.json",
                                   layers_in_weights=layer_indices(tensors, KimiLinearLM.LAYER_PREFIX))
    state = {_our_name(name): tensor for name, tensor in tensors.items()}
    for index in range(cfg.num_hidden_layers):
        if cfg.is_moe_layer(index):
            prefix = f"model.layers.{index}.mlp."
            latent = {k: v for k, v in state.items() if _LATENT.match(k)}
            block = expert_state_from_hf(prefix, {k: v for k, v in state.items() if k not in latent})
            state = {k: v for k, v in state.items() if not k.startswith(prefix) or k in latent} | {
                prefix + name: tensor for name, tensor in block.items()}
    return cfg, {name: _per_head_a_log(name, tensor, cfg) for name, tensor in state.items()}


_TOLD_VISION_LEFT_OUT: set[str] = set()
"""Folders already told about (an export reads its folder up to three times: trace, reference, routing check)."""


def _k3_text_model(config: dict, tensors: dict[str, torch.Tensor], where: str
                   ) -> tuple[dict, dict[str, torch.Tensor]]:
    """The text model's config and tensors of a K3 folder; the vision tower and projector left out in one line."""
    unknown = sorted(set(config) - K3_WRAPPER_KEYS)
    if unknown:
        raise CheckpointError(f"{where}/config.json: top-level key{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(unknown)} of a kimi_k3 folder not implemented (the text model's keys "
                              "belong in text_config)")
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise CheckpointError(f"{where}/config.json: a kimi_k3 folder needs its text model's config as a "
                              "text_config object")
    if config.get("quantization_config") is not None:
        text = {**text, "quantization_config": config["quantization_config"]}
    vision = [name for name in tensors if name.startswith(VISION_PREFIXES)]
    stray = sorted(name for name in tensors if not name.startswith((TEXT_PREFIX, *VISION_PREFIXES)))
    if stray:
        raise CheckpointError(f"{where}: {stray[0]} is neither a {TEXT_PREFIX}* tensor of the text model nor a "
                              "vision_tower.* / mm_projector.* one of a kimi_k3 folder")
    if vision and where not in _TOLD_VISION_LEFT_OUT:
        _TOLD_VISION_LEFT_OUT.add(where)
        log.warning("%s: left out %d vision-tower and projector tensors (vision_tower.*, mm_projector.*): attnres "
                    "exports the text model of a kimi_k3 folder", where, len(vision))
    return text, {name[len(TEXT_PREFIX):]: t for name, t in tensors.items() if name.startswith(TEXT_PREFIX)}


def _per_head_a_log(name: str, tensor: torch.Tensor, cfg: KimiLinearConfig) -> torch.Tensor:
    """A KDA layer's ``A_log`` as ``[1, 1, H, 1]``: transformers saves that shape; K3 ships ``[head_dim]``."""
    heads = cfg.kda.num_heads
    if not _A_LOG.match(name) or tensor.dim() != 1:
        return tensor
    if tensor.numel() < heads:
        raise CheckpointError(f"{name}: {tensor.numel()} values, fewer than the {heads} KDA heads")
    return tensor[:heads].reshape(1, 1, heads, 1)


def _our_name(name: str) -> str:
    name = _SAVED_FFN.sub(r"\1mlp.", name)
    return _SAVED_EXPERT.sub(lambda m: f"{m[1]}{_EXPERT_NAMES[m[2]]}.weight", name)
