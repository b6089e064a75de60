"""Decoder LM bodies people deploy (Llama, Qwen2, Qwen3, Qwen3-MoE, DeepSeek-V3) with transformers' semantics,
with standard residuals or Kimi K3's Attention Residuals (docs/models.md#decoderlm)."""

from attnres_export.models.decoder.config import DecoderConfig
from attnres_export.models.decoder.folder import from_hf_folder
from attnres_export.models.decoder.hf_config import parse_hf_config
from attnres_export.models.decoder.model import DecoderLM

__all__ = ["DecoderConfig", "DecoderLM", "from_hf_folder", "parse_hf_config"]
