"""Reference PyTorch models and their checkpoint format."""

from attnres_export.models.checkpoint import build_model, load_checkpoint, save_checkpoint
from attnres_export.models.config import ModelConfig

__all__ = ["ModelConfig", "build_model", "load_checkpoint", "save_checkpoint"]
