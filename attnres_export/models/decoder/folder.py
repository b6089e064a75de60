"""Reading a Hugging Face folder of one of the decoder families (docs/models.md#decoderlm), without renaming.

The checkpoint loader (``models/checkpoint.py``) reads ``config.json`` and the safetensors and hands them to
``read_hf`` (the family's ``hf_reader`` in the registry), which parses the config with transformers' semantics and
returns the state_dict the model takes: transformers' names, plus with AttnRes the K3 site weights. Two things
transformers also accepts are handled the same way: with ``tie_word_embeddings`` the folder may leave out
``lm_head.weight`` (one that is given must equal the embedding), and DeepSeek's multi-token-prediction layers stored
after the body (``model.layers.{N}..``) are not loaded. Everything else missing, extra or misshapen is refused in one
line naming it (by the loader).
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnres_export.errors import CheckpointError
from attnres_export.models.decoder.config import DecoderConfig
from attnres_export.models.decoder.hf_config import parse_hf_config
from attnres_export.models.decoder.model import DecoderLM
from attnres_export.models.layers.moe import expert_state_from_hf
from attnres_export.models.limits import layer_index, layer_indices
from attnres_export.models.store.tensors import StoredTensor

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def read_hf(config: dict, tensors: dict[str, StoredTensor], where: str
            ) -> tuple[DecoderConfig, dict[str, StoredTensor]]:
    """``(config, state_dict)`` of a folder's ``config.json`` and its tensors (``models/store``: nothing is read
    here but the tied head, compared with the embedding)."""
    cfg = parse_hf_config(config, where=f"{where}/config.json",
                          layers_in_weights=layer_indices(tensors, DecoderLM.LAYER_PREFIX))
    state = _with_stacked_experts(cfg, _without_mtp_layers(cfg, dict(tensors)))
    if cfg.tie_word_embeddings and EMBED in state:
        if HEAD in state and not torch.equal(state[HEAD], state[EMBED]):
            raise CheckpointError(f"{where}: tie_word_embeddings is true but {HEAD} differs from {EMBED}")
        state[HEAD] = state[EMBED]
    return cfg, state


def from_hf_folder(path: Path | str, dtype: torch.dtype | None = None) -> DecoderLM:
    """The model of a folder, its weights in ``dtype`` (default: as stored); the AttnRes site weights are always
    float32 (they are folded in float32)."""
    from attnres_export.models.checkpoint import load_checkpoint

    model, _ = load_checkpoint(Path(path), dtype=str(dtype).removeprefix("torch.") if dtype else None)
    return model


def _with_stacked_experts(cfg: DecoderConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with each MoE layer's experts in the stacked form the model holds (a folder may store them per
    expert, as published checkpoints do, or stacked)."""
    for index in cfg.moe_layers:
        prefix = f"model.layers.{index}.mlp."
        block = expert_state_from_hf(prefix, state)
        state = {k: v for k, v in state.items() if not k.startswith(prefix)}
        state |= {prefix + name: tensor for name, tensor in block.items()}
    return state


def _without_mtp_layers(cfg: DecoderConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` without DeepSeek's multi-token-prediction layers (indices ``N .. N + mtp_layers - 1``), found by
    each name's index (no list of ``mtp_layers`` prefixes is made)."""
    first, end = cfg.num_hidden_layers, cfg.num_hidden_layers + cfg.mtp_layers

    def is_mtp(name: str) -> bool:
        index = layer_index(name, DecoderLM.LAYER_PREFIX)
        return index is not None and first <= index < end

    return {k: v for k, v in state.items() if not is_mtp(k)}
