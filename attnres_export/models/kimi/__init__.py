"""Kimi Linear's layers (docs/models.md#kimi-delta-attention): Kimi Delta Attention with its state."""

from attnres_export.models.kimi.config import KdaConfig
from attnres_export.models.kimi.kda import KdaState, KimiDeltaAttention, state_dict_from_transformers

__all__ = ["KdaConfig", "KdaState", "KimiDeltaAttention", "state_dict_from_transformers"]
